# Sourced by the e2e test scripts (tests/server/run.sh, tests/server/clients/run.sh,
# tests/router/run.sh, tests/router/pd_run.sh): the pinned PyPI clients they drive, in a venv
# under the build directory.
# pinned_venv VENV REQUIREMENTS PROBE: (re)creates VENV from REQUIREMENTS unless VENV/bin/PROBE
# exists and the venv was made from the same file. When the packages cannot be installed it asks
# the package index whether it answers at all: if not (offline without a prepared venv) it exits
# the calling script with 77 (ctest's "skipped"); if it does, the failure is this machine's (a
# full disk, a broken pin) and the test fails, so a skip never hides one.
pinned_venv() {
  local venv="$1" requirements="$2" probe="$3"
  local who
  who="$(basename "$(dirname "$requirements")")/run.sh"
  if [[ -x "$venv/bin/$probe" ]] && cmp -s "$requirements" "$venv/.requirements"; then
    return 0
  fi
  rm -f "$venv/.requirements"
  if ! python3 -m venv "$venv"; then
    echo "$who: cannot create the venv $venv" >&2
    exit 1
  fi
  if "$venv/bin/pip" install -q -r "$requirements"; then
    cp "$requirements" "$venv/.requirements"
    return 0
  fi
  if "$venv/bin/pip" index versions pip --timeout 15 --retries 1 >/dev/null 2>&1; then
    echo "$who: the package index answers, but installing $requirements failed (see above; disk: $(df -h --output=avail "$venv" | tail -1 | tr -d ' ') free)" >&2
    exit 1
  fi
  echo "$who: cannot install $requirements and the package index does not answer (offline?); skipping" >&2
  exit 77
}
