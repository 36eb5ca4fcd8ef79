module example.com/heartbeat-bench

go 1.22

require github.com/rdzv/rdzv/bindings/go v0.0.0

replace github.com/rdzv/rdzv/bindings/go => ../../../bindings/go
