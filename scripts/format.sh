#!/usr/bin/env bash
# Formats slotstream's C++ with its .clang-format (clang-format from Debian's clang-format package).
#   bash scripts/format.sh           formats every tracked .cc/.h file in place
#   bash scripts/format.sh --check   changes nothing; lists the files that are not formatted and fails
set -euo pipefail
cd "$(dirname "$0")/.."
cf=$(command -v clang-format-14 || command -v clang-format || true)
[ -n "$cf" ] || { echo "format: clang-format is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.cc' '*.h')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do "$cf" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f"); done
  if ((${#bad[@]})); then
    printf 'format: not formatted (run bash scripts/format.sh):\n' >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files formatted"
else
  "$cf" -i "${files[@]}"
fi
