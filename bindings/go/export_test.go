package rdzv

// EtcdURLForExamples is a rendezvous URL on the etcd the package's tests run against (started
// by TestMain), for the examples in example_test.go (package rdzv_test), which run as tests:
// etcd://HOST:PORT/RUN-...?QUERY.
func EtcdURLForExamples(run, query string) string { return testEtcd.url(run, query) }
