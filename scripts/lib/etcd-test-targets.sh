# shellcheck shell=bash
# etcd_test_targets: the cargo test targets that start etcd (those using tests/common), by
# name, one per line: tests/all (every integration area), the logging programs and the `rdzv`
# command's. The framework suites (PyTorch, JAX, Lightning and DeepSpeed) are left out: they
# need their environments and run once, on the newest etcd.
etcd_test_targets() {
  local target
  for target in tests/all/main.rs tests/*.rs cli/tests/*.rs; do
    case "$target" in
      cli/tests/launcher_torch.rs | cli/tests/launcher_jax.rs | cli/tests/launcher_torch_frameworks.rs) continue ;;
      tests/all/main.rs) echo all ;;
      *) if grep -q '^mod common;' "$target"; then basename "$target" .rs; fi ;;
    esac
  done
}
