# shellcheck shell=bash
# etcd_test_targets: the cargo test targets that start etcd (those using tests/common), by
# name, one per line: tests/all (every integration area), the logging programs and the `rdzv`
# command's. The framework suites (PyTorch, JAX, Lightning and DeepSpeed) are left out: they
# need their environments and run once, on the newest etcd. So are the launcher's monitors
# (cli/tests/hangs.rs): they reach etcd only through the round's and the run's stores, which
# tests/all runs on every version.
etcd_test_targets() {
  local target
  for target in tests/all/main.rs tests/*.rs cli/tests/*.rs; do
    case "$target" in
      cli/tests/launcher_torch.rs | cli/tests/launcher_jax.rs | cli/tests/launcher_torch_frameworks.rs | cli/tests/hangs.rs | cli/tests/at_rest.rs) continue ;;
      tests/all/main.rs) echo all ;;
      *) if grep -q '^mod common;' "$target"; then basename "$target" .rs; fi ;;
    esac
  done
}
