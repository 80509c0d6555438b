#!/usr/bin/env python3
"""Generates slotstream's man page and its bash and zsh completions from `slotstream --help` and each
command's `--help`, so they cannot drift from the options the binary has (run by the build; installed
under share/).

    gen_cli_docs.py SLOTSTREAM OUTDIR
      OUTDIR/man/man1/slotstream.1
      OUTDIR/bash-completion/completions/slotstream
      OUTDIR/zsh/site-functions/_slotstream
"""
import datetime
import os
import pathlib
import re
import subprocess
import sys

# An option line of CLI11's help: "  -h,--help   text", "  --transport TEXT:{auto,shm}=auto", with the
# description after two or more spaces or on the next, indented line.
OPTION = re.compile(r"^  (?:-\w,)?(--[\w-]+)(.*)$")
HELP_COLUMN = 30  # CLI11's default column width: the help text starts here
COMMAND = re.compile(r"^  ([a-z][\w-]*)\s{2,}(.*)$")
# Options whose value is a path (completed with file names).
PATH_OPTIONS = {"--out", "--config", "--token-file", "--worker-dir", "--file", "--dir", "--video"}


def run_help(binary, *args):
    p = subprocess.run([binary, *args, "--help"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        sys.exit(f"gen_cli_docs: {binary} {' '.join(args)} --help failed: {p.stderr}")
    return p.stdout


def parse_option(line):
    """One option line: "  --name SPEC" padded to column 30, then its help; SPEC is the value's type
    ("TEXT", "UINT:SIZE", "TEXT:{a,b}=a", "FLOAT:FLOAT in [1 - 600000]=200"), REQUIRED or Excludes: ...
    A SPEC too long for the column takes the whole line, and the help follows on the next lines."""
    if len(line) > HELP_COLUMN and line[HELP_COLUMN - 1] == " ":
        head, help_text = line[:HELP_COLUMN].strip(), line[HELP_COLUMN:].strip()
    else:
        head, help_text = line.strip(), ""
    m = re.match(r"(?:-\w,)?(--[\w-]+) ?(.*)", head)
    name, spec = m.group(1), m.group(2)
    arg = re.match(r"([A-Z]+)\b", spec)
    choices = re.search(r"\{([^}]*)\}", spec)
    return {"name": name,
            "arg": arg.group(1) if arg and arg.group(1) not in ("REQUIRED", "Excludes", "Needs") else "",
            "choices": choices.group(1).split(",") if choices else [],
            "help": help_text}


def parse(text):
    """(description, [commands as (name, summary)], [options as dict(name, arg, choices, help)], footer): the
    footer is the paragraph after the options (a command's notes: its end, signals, units)."""
    lines = text.splitlines()
    description = lines[0].strip() if lines else ""
    commands, options, section, footer = [], [], None, []
    for line in lines[1:]:
        if line.endswith(":") and not line.startswith(" "):
            section = line[:-1]
            continue
        if section is not None and line.strip() and not line.startswith(" "):
            footer.append(line.strip())
            continue
        if section == "Subcommands":
            m = COMMAND.match(line)
            if m:
                commands.append((m.group(1), m.group(2).strip()))
        elif section is not None and OPTION.match(line):
            options.append(parse_option(line))
        elif section is not None and line.startswith(" " * HELP_COLUMN) and options and line.strip():
            options[-1]["help"] = (options[-1]["help"] + " " + line.strip()).strip()
    return description, commands, options, " ".join(footer)


def roff(text):
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + l if l.startswith((".", "'")) else l) for l in text.split("\n"))


# The README's first steps: one host pair over tcp, then both ends on one host over shared memory.
EXAMPLES = [
    ("The receiver (host B) stores OUT/SENDER/device-D/SEQ.bin, complete and in order",
     "slotstream recv --listen 0.0.0.0:7000 --out /data/streams --token-file token"),
    ("The sender (host A): 12 synthetic 640x480x3 cameras at 25 fps for 10 s, over tcp",
     "slotstream send --to B:7000 --name edge-a --token-file token --transport tcp \\\n"
     "    --synthetic 0-11:25:640x480x3 --duration 10"),
    ("Every received frame's content and order checked",
     "slotstream verify /data/streams"),
    ("Both ends on one host, over shared memory",
     "slotstream recv --listen 127.0.0.1:7000 --out /tmp/streams &\n"
     "slotstream send --to 127.0.0.1:7000 --name edge-a --transport shm --synthetic 0-11:25:640x480x3 --duration 10"),
    ("Every option from a TOML file, the command line winning",
     "slotstream recv --config /etc/slotstream/recv.toml"),
    ("12 cameras over shared memory in one command, verified",
     "slotstream demo"),
]
# docs/cli-contract.md says which command exits with which code in which case.
EXIT_STATUS = [
    ("0", "Success: recv on SIGINT/SIGTERM or after --exit-after-senders K senders; send once the receiver "
          "confirmed every message stored; verify when every frame checks."),
    ("1", "A runtime failure (a receiver that cannot be reached or refuses, a lost connection, a frame that does not "
          "verify); one stderr line starting 'slotstream COMMAND: error:' says what."),
    ("2", "A usage error, found before anything is sent: an unknown command or option (the closest one named), a "
          "value out of its range, a file that cannot be opened, --transport rdma without a usable RDMA device."),
    ("130, 143", "send stopped by SIGINT (Ctrl-C) or SIGTERM after a clean finish: the messages started were "
                 "finished and the summary printed (a second signal aborts at once)."),
]


def man_page(binary, version, top, commands):
    description, _, top_options, _ = top
    out = [f'.TH SLOTSTREAM 1 "{datetime.date.today().isoformat()}" "slotstream {version}" "User Commands"',
           ".SH NAME", "slotstream \\- many device streams over one one\\-sided RDMA connection (UCX)",
           ".SH SYNOPSIS", ".B slotstream", "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fICOMMAND OPTIONS\\fR]",
           ".SH DESCRIPTION", roff(description),
           "This page is generated from \\fBslotstream \\-\\-help\\fR and each command's \\fB\\-\\-help\\fR.",
           ".SH OPTIONS"]
    out += option_items(top_options)
    out.append(".SH COMMANDS")
    for name, summary, (_, _, options, footer) in commands:
        out += [f".SS slotstream {name}", roff(summary)]
        out += option_items(options)
        if footer:
            out += [".PP", roff(footer)]
    out += [".SH EXAMPLES"]
    for comment, command in EXAMPLES:
        out += [".PP", roff(comment) + ":", ".PP", ".RS", ".nf", roff(command), ".fi", ".RE"]
    out += [".SH EXIT STATUS"]
    for code, meaning in EXIT_STATUS:
        out += [".TP", f".B {code}", roff(meaning)]
    out += [".PP", "Each command's cases: docs/cli\\-contract.md of the slotstream sources."]
    out += [".SH FILES", ".TP", ".I /etc/slotstream/recv.toml",
            "a configuration file for \\fBslotstream recv \\-\\-config\\fR (docs/config.md)",
            ".SH SEE ALSO", "The README and docs/ of the slotstream sources; \\fBslotstream protocols\\fR."]
    return "\n".join(out) + "\n"


def option_items(options):
    items = []
    for o in options:
        if o["name"] == "--help":
            continue
        arg = f" \\fI{o['arg']}\\fR" if o["arg"] else ""
        items += [".TP", f"\\fB{roff(o['name'])}\\fR{arg}", roff(o["help"])
                  + (f" One of: {', '.join(o['choices'])}." if o["choices"] else "")]
    return items


def bash_completion(top, commands):
    names = " ".join(c[0] for c in commands)
    cases, choices = [], {}
    for name, _, (_, _, options, _) in commands:
        cases.append(f'    {name}) opts="{" ".join(o["name"] for o in options)}" ;;')
        for o in options:
            for c in o["choices"]:  # the union over commands (demo's --transport takes fewer)
                choices.setdefault(o["name"], []).count(c) or choices[o["name"]].append(c)
    values = [f'    {n}) COMPREPLY=($(compgen -W "{" ".join(c)}" -- "$cur")); return ;;' for n, c in choices.items()]
    paths = "|".join(sorted(PATH_OPTIONS))
    top_opts = " ".join(o["name"] for o in top[2])
    return f"""# bash completion for slotstream (generated from --help by tools/gen_cli_docs.py)
_slotstream() {{
  local cur prev cmd opts i
  cur="${{COMP_WORDS[COMP_CWORD]}}"
  prev="${{COMP_WORDS[COMP_CWORD-1]}}"
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in -*) ;; *) cmd="${{COMP_WORDS[i]}}"; break ;; esac
  done
  case "$prev" in
{chr(10).join(sorted(set(values)))}
    {paths}) COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  if [[ -z "$cmd" ]]; then
    COMPREPLY=($(compgen -W "{names} {top_opts}" -- "$cur"))
    return
  fi
  case "$cmd" in
{chr(10).join(cases)}
    *) opts="" ;;
  esac
  COMPREPLY=($(compgen -W "$opts --config --help" -- "$cur"))
}}
complete -F _slotstream slotstream
"""


def zsh_quote(text):
    return text.replace("\\", "\\\\").replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")


def zsh_completion(top, commands):
    funcs, listing = [], []
    for name, summary, (_, _, options, _) in commands:
        listing.append(f"    '{name}:{zsh_quote(summary[:70])}'")
        specs = []
        for o in options:
            if o["name"] == "--help":
                continue
            action = ""
            if o["choices"]:
                action = f":value:({' '.join(o['choices'])})"
            elif o["name"] in PATH_OPTIONS:
                action = ":path:_files"
            elif o["arg"]:
                action = ":value: "
            specs.append(f"    '{o['name']}[{zsh_quote(o['help'][:80])}]{action}'")
        specs.append("    '--config[TOML file of options]:path:_files'")
        funcs.append(f"_slotstream_{name.replace('-', '_')}() {{\n  _arguments \\\n" + " \\\n".join(specs) + "\n}")
    return f"""#compdef slotstream
# zsh completion for slotstream (generated from --help by tools/gen_cli_docs.py)
{chr(10).join(funcs)}

_slotstream() {{
  local -a commands
  commands=(
{chr(10).join(listing)}
  )
  if (( CURRENT == 2 )); then
    _describe 'command' commands
    return
  fi
  local cmd=${{words[2]}}
  shift words; (( CURRENT-- ))
  (( $+functions[_slotstream_${{cmd//-/_}}] )) && _slotstream_${{cmd//-/_}}
}}

_slotstream "$@"
"""


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binary, outdir = sys.argv[1], pathlib.Path(sys.argv[2])
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout.split()[-1]
    top = parse(run_help(binary))
    # `bench` hands its arguments to the orchestrator, whose options are its own (slotstream bench --help).
    commands = [(name, summary, parse(run_help(binary, name)) if name != "bench" else ("", [], [], ""))
                for name, summary in top[1]]
    files = {"man/man1/slotstream.1": man_page(binary, version, top, commands),
             "bash-completion/completions/slotstream": bash_completion(top, commands),
             "zsh/site-functions/_slotstream": zsh_completion(top, commands)}
    for rel, text in files.items():
        path = outdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


if __name__ == "__main__":
    main()
