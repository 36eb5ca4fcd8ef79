//go:build rdzv_dev

package rdzv

// The repository's own flow (tests, demo): link target/debug and record it as an rpath, so
// nothing needs installing and no LD_LIBRARY_PATH is needed.

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../target/debug -Wl,-rpath,${SRCDIR}/../../target/debug -lrdzv
*/
import "C"
