package rdzv

/*
#include <stdlib.h>
#include "rdzv.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Params are the parameters of a rendezvous (torch's RendezvousParameters).
type Params struct {
	mu   sync.RWMutex // Set and Close write; NewRendezvous reads
	_ptr *C.rdzv_params_t
}

// ParamsFromURL parses etcd://HOST:PORT[,HOST:PORT...]/RUN_ID?name=value&... (see Set for
// the names).
func ParamsFromURL(url string) (*Params, error) {
	routeLogs()
	curl := C.CString(url)
	defer C.free(unsafe.Pointer(curl))
	var out *C.rdzv_params_t
	if err := call(func(e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_params_from_url(curl, &out, e)
	}); err != nil {
		return nil, err
	}
	return newParams(out), nil
}

// NewParams builds parameters from explicit values: backend "etcd-v3" (or "etcd"), endpoints
// "HOST:PORT[,HOST:PORT...]", a non-empty run id and 1 <= minNodes <= maxNodes.
func NewParams(backend, endpoints, runID string, minNodes, maxNodes uint32) (*Params, error) {
	routeLogs()
	cb, ce, cr := C.CString(backend), C.CString(endpoints), C.CString(runID)
	defer C.free(unsafe.Pointer(cb))
	defer C.free(unsafe.Pointer(ce))
	defer C.free(unsafe.Pointer(cr))
	var out *C.rdzv_params_t
	if err := call(func(e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_params_new(cb, ce, cr, C.uint32_t(minNodes), C.uint32_t(maxNodes), &out, e)
	}); err != nil {
		return nil, err
	}
	return newParams(out), nil
}

func newParams(ptr *C.rdzv_params_t) *Params {
	p := &Params{_ptr: ptr}
	runtime.SetFinalizer(p, func(p *Params) { _ = p.Close() })
	return p
}

// Set sets one option, e.g. "min_nodes", "max_nodes", "join_timeout" (seconds),
// "last_call_timeout", "lease_ttl", "local_addr"; see rdzv_params_set in rdzv.h for all.
// An unknown name or a bad value gives ErrInvalidArgument and leaves p unchanged.
func (p *Params) Set(name, value string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p._ptr == nil {
		return errClosedHandle("Params")
	}
	cn, cv := C.CString(name), C.CString(value)
	defer C.free(unsafe.Pointer(cn))
	defer C.free(unsafe.Pointer(cv))
	err := call(func(e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_params_set(p._ptr, cn, cv, e)
	})
	runtime.KeepAlive(p)
	return err
}

// Close frees the parameters. Idempotent. Rendezvous made from them are not affected.
func (p *Params) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p._ptr != nil {
		C.rdzv_params_free(p._ptr)
		p._ptr = nil
		runtime.SetFinalizer(p, nil)
	}
	return nil
}
