# Sourced by the server e2e scripts. server_test_model DSINFER BUILD_DIR PRESET: prints the demo
# checkpoint the server suites use for PRESET (BUILD_DIR/server-test-model[-PRESET]), writing it
# once. V4.1 presets take V4.1's own tokenizer (Engram's token map is built from it).
server_test_model() {
  local dsinfer="$1" build="$2" preset="$3"
  local root suffix="" model
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
  [[ "$preset" == demo ]] || suffix="-$preset"
  model="$build/server-test-model$suffix"
  local tokenizer_args=()
  if [[ "$preset" == *v4.1* ]]; then
    tokenizer_args=(--tokenizer "$root/tests/fixtures/tokenizer/deepseek-v4/tokenizer.json"
      --tokenizer-overlay "$root/tests/fixtures/v41/tokenizer_overlay.json")
  fi
  if [[ ! -f "$model/config.json" ]]; then
    "$dsinfer" create-demo-model "$model" --preset "$preset" --seed 1 "${tokenizer_args[@]}" >&2
  fi
  echo "$model"
}
