# shellcheck shell=bash
# etcd_test_targets: the cargo test targets that start etcd (those using the test harness crate,
# rdzv-test-support), by name, one per line: tests/all (every integration area), the logging
# programs and the `rdzv` command's. The framework suites (PyTorch, JAX, Lightning and
# DeepSpeed) are left out: they need their environments and run once, on the newest etcd. So
# are the launcher's monitors and incident records (cli/tests/hangs.rs, incidents.rs): they
# reach etcd only through the round's and the run's stores, which tests/all runs on every
# version; and four lanes of their timed faults at once on 2 cores measure the load, not rdzv.
etcd_test_targets() {
  local target
  for target in tests/all/main.rs tests/*.rs cli/tests/*.rs; do
    case "$target" in
      cli/tests/launcher_torch.rs | cli/tests/launcher_jax.rs | cli/tests/launcher_torch_frameworks.rs | cli/tests/hangs.rs | cli/tests/incidents.rs | cli/tests/at_rest.rs) continue ;;
      tests/all/main.rs) echo all ;;
      *) if grep -q '^use rdzv_test_support' "$target"; then basename "$target" .rs; fi ;;
    esac
  done
}

# etcd_test_skips: `--skip FILTER` arguments for the runs on the older etcd versions: the
# tests whose etcd use is the same on every version, or which pick their etcd themselves, run
# on the newest alone. Random faults against a running job for 90 s (tests/all/chaos: the same
# protocol calls as the fault and race suites, which run on every version), the rolling
# upgrade (it runs 3.5 and then 3.6, whatever is on PATH), the C program under valgrind (the
# library's memory, not etcd's answers) and the rounds of 256 and 1024 nodes (CPU, on a
# machine that runs four such lanes at once).
etcd_test_skips() {
  printf -- '--skip\n%s\n' \
    chaos::a_job_under_random_faults_keeps_every_guarantee \
    cluster::a_job_rides_out_a_rolling_upgrade_of_its_etcd \
    c_api::c_program_is_clean_under_valgrind \
    scale::
}
