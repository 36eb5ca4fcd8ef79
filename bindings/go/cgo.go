//go:build !rdzv_dev

package rdzv

// By default the package links the installed library through pkg-config (scripts/install.sh
// installs it with rdzv.pc; set PKG_CONFIG_PATH for a prefix pkg-config does not search).
// Inside the repository, build with -tags rdzv_dev to link the repository's debug build
// instead (cgo_dev.go).

/*
#cgo pkg-config: rdzv
*/
import "C"
