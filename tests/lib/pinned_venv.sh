# Sourced by the e2e test scripts (tests/server/run.sh, tests/server/clients/run.sh,
# tests/router/run.sh): the pinned PyPI clients they drive, in a venv under the build directory.
# pinned_venv VENV REQUIREMENTS PROBE: (re)creates VENV from REQUIREMENTS unless VENV/bin/PROBE
# exists and the venv was made from the same file; exits the calling script with 77 (ctest's
# "skipped") when the packages cannot be installed, e.g. offline without a prepared venv.
pinned_venv() {
  local venv="$1" requirements="$2" probe="$3"
  if [[ -x "$venv/bin/$probe" ]] && cmp -s "$requirements" "$venv/.requirements"; then
    return 0
  fi
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install -q -r "$requirements"; then
    echo "$(basename "$(dirname "$requirements")")/run.sh: cannot install $requirements (offline?); skipping" >&2
    exit 77
  fi
  cp "$requirements" "$venv/.requirements"
}
