//go:build rdzv_dev

package rdzv

// The repository's own flow (tests, demo): link the debug build and record its directory as
// an rpath, so nothing needs installing and no LD_LIBRARY_PATH is needed. The directory is
// scripts/dev-lib.sh's (run it once after the first cargo build): the built library under the
// names an installed one has, librdzv.so.0 (its SONAME, which the program looks for) among
// them.

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: -L${SRCDIR}/../../target/dev-lib/debug -Wl,-rpath,${SRCDIR}/../../target/dev-lib/debug -lrdzv
*/
import "C"
