module github.com/rdzv/rdzv/bindings/go

go 1.22
