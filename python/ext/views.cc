// The buffer protocol of Frame and MessageView (PyView), and their Python classes.
#include "views.h"

namespace slotstream::py {

namespace {

int frame_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  static std::byte empty{};
  Frame* f = nb::inst_ptr<Frame>(self);
  return PyBuffer_FillInfo(view, self, f->data ? f->data : &empty, Py_ssize_t(f->size), /*readonly=*/0, flags);
}

PyType_Slot frame_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(frame_getbuffer)}, {0, nullptr}};

int view_getbuffer(PyObject* self, Py_buffer* out, int flags) {
  PyView* v = nb::inst_ptr<PyView>(self);
  if (!v->view) {
    PyErr_SetString(PyExc_ValueError,
                    "this message view was released: its receive block may hold other data now (keep the view, "
                    "or copy the bytes before releasing it)");
    out->obj = nullptr;
    return -1;
  }
  static std::byte empty{};
  auto data = v->view.data();
  void* p = data.empty() ? static_cast<void*>(&empty) : const_cast<std::byte*>(data.data());
  if (PyBuffer_FillInfo(out, self, p, Py_ssize_t(data.size()), /*readonly=*/1, flags) != 0) return -1;
  ++v->exports;
  return 0;
}

void view_releasebuffer(PyObject* self, Py_buffer*) { --nb::inst_ptr<PyView>(self)->exports; }

PyType_Slot view_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(view_getbuffer)},
                            {Py_bf_releasebuffer, reinterpret_cast<void*>(view_releasebuffer)},
                            {0, nullptr}};

}  // namespace

nb::object memoryview_of(Frame&& frame) {
  nb::object obj = nb::cast(std::move(frame));
  nb::object view = nb::steal(PyMemoryView_FromObject(obj.ptr()));
  if (!view.is_valid()) throw nb::python_error();
  return view;
}

void bind_frame(nb::module_& m) {
  nb::class_<Frame>(m, "Frame", nb::type_slots(frame_slots),
                    "A received message's bytes, owned by this object; read it through memoryview().");
}

void bind_message_view(nb::module_& m) {
  nb::class_<PyView>(
      m, "MessageView", nb::type_slots(view_slots),
      "One message lent in place by Receiver(..., zero_copy=True): memoryview(v) or numpy.frombuffer(v)\n"
      "read the receive block itself (read-only, no copy). The block stays held (the sender skips it)\n"
      "until release(), the end of a `with` block, or garbage collection. release() while a memoryview\n"
      "or numpy array still uses it raises BufferError; reading a released view raises ValueError.")
      .def("release", &PyView::release,
           "Gives the message's block back to the sender (idempotent). Raises BufferError while a memoryview or\n"
           "numpy array made from this view still exists.")
      .def(
          "__enter__", [](nb::handle self) { return self; }, nb::sig("def __enter__(self) -> MessageView"))
      .def(
          "__exit__", [](PyView& v, nb::args) { v.release(); }, nb::sig("def __exit__(self, *args) -> None"))
      .def("__len__", [](const PyView& v) { return v.view.data().size(); })
      .def_prop_ro(
          "released", [](const PyView& v) { return !v.view; }, "Whether release() was called (or it was collected).")
      .def_prop_ro(
          "copied", [](const PyView& v) { return v.view.copied(); },
          "True for a message that spanned several blocks: it was copied once (not in place).")
      .def_prop_ro(
          "in_place", [](const PyView& v) { return v.view.in_registered_memory(); },
          "Whether the bytes lie in the receive memory registered with UCX (False for copies and once released).")
      .def_prop_ro(
          "address", [](const PyView& v) { return reinterpret_cast<uintptr_t>(v.view.data().data()); },
          "Address of the first byte (0 once released): numpy's data pointer is the same, no copy.")
      .def_ro("sender", &PyView::sender)
      .def_prop_ro("device", [](const PyView& v) { return v.view.device(); })
      .def_ro("seq", &PyView::seq, "The message's number on its device (as in the tuple).");
}

}  // namespace slotstream::py
