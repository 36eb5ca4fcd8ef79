//go:build !rdzv_release

package rdzv

// By default the package links the repository's debug build of the Rust library and records
// its directory as an rpath, so tests and examples run without LD_LIBRARY_PATH. Build with
// -tags rdzv_release for target/release, or see README.md to use any other build.

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../target/debug -Wl,-rpath,${SRCDIR}/../../target/debug -lrdzv
*/
import "C"
