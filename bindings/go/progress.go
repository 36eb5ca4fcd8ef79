package rdzv

/*
#include <stdlib.h>
#include "rdzv.h"
*/
import "C"

import (
	"strings"
	"sync"
	"unsafe"
)

// Progress: a worker's heartbeats and named sections, for the hang monitor of `rdzv run`.
//
// Under `rdzv run` (RDZV_PROGRESS_FILE in the environment) each call is a few stores to a page
// the launcher reads: tens of nanoseconds in C, plus the cost of a cgo call here. Outside it
// every call returns at once, but steps and section names are still checked, so a bad one is
// found before a real run. The page is mapped on the process's first progress call. All of
// these are safe for concurrent use; sections belong to the process, not to a goroutine.

// Heartbeat records one heartbeat: the worker made progress (call it once per training step).
// It never fails and never blocks.
func Heartbeat() { C.rdzv_heartbeat() }

// HeartbeatStep is a heartbeat that also says which step the worker reached: a global
// iteration that goes on from a checkpoint across restarts, which `rdzv run` compares across
// attempts to tell a job that makes no progress. A negative step is ErrInvalidArgument.
func HeartbeatStep(step int64) error {
	return call(func(e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_heartbeat_step(C.int64_t(step), e)
	})
}

// SectionBegin opens the section name (1 to 39 bytes of UTF-8): `rdzv run --section-timeout
// name=SECONDS` runs until SectionEnd(name). Sections nest. A bad name is ErrInvalidArgument.
func SectionBegin(name string) error {
	return withSectionName(name, func(c *C.char) error {
		return call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_section_begin(c, e) })
	})
}

// SectionEnd closes the innermost open section called name and records how long it took. A
// bad name is ErrInvalidArgument, and so, under `rdzv run`, is a section that is not open.
func SectionEnd(name string) error {
	return withSectionName(name, func(c *C.char) error {
		return call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_section_end(c, e) })
	})
}

// Section opens the section name and returns the function that closes it, for defer:
//
//	end, err := rdzv.Section("checkpoint")
//	if err != nil { ... }
//	defer end()
//
// end closes the section once; later calls return nil.
func Section(name string) (end func() error, err error) {
	if err := SectionBegin(name); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() { err = SectionEnd(name) })
		return err
	}, nil
}

// ProgressPause pauses the hang monitoring of this process until its next heartbeat or
// section: for work without steps that may outlast the hang timeout (a final checkpoint, an
// evaluation, the program's end). Call it before os.Exit, which runs no exit handlers; a
// return from main runs none either, so a Go worker whose end may be slow pauses itself.
func ProgressPause() { C.rdzv_progress_pause() }

// IsMonitored reports whether this process runs under the progress monitoring of `rdzv run`:
// its heartbeats and sections are seen.
func IsMonitored() bool { return bool(C.rdzv_is_monitored()) }

// SetStackSignal tells `rdzv run` which signal makes this process write its stacks to the file
// named by RDZV_STACKS_FILE (a handler the program installed, with os/signal and
// runtime/pprof's goroutine profile, say); 0 takes it back. The launcher sends it to a hung
// worker before stopping it, so only a program that handles the signal may name it: its
// default action would otherwise end the process. sig must be 0 to 64.
func SetStackSignal(sig int) error {
	return call(func(e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_set_stack_signal(C.int32_t(sig), e)
	})
}

// sectionNames holds the C copies of section names already used: a program uses a few names
// over and over, and a C string made once spares every later call an allocation and a free.
// Bounded, so a program that makes names up as it goes does not grow it without end.
var sectionNames struct {
	sync.RWMutex
	m map[string]*C.char
}

const maxCachedSectionNames = 256

// withSectionName runs f with name as a C string. A NUL inside would cut the name short in C,
// so it is refused here.
func withSectionName(name string, f func(*C.char) error) error {
	if strings.IndexByte(name, 0) >= 0 {
		return &Error{Status: StatusInvalidArgument, Message: "section name: contains a NUL byte"}
	}
	sectionNames.RLock()
	c, ok := sectionNames.m[name]
	sectionNames.RUnlock()
	if ok {
		return f(c)
	}
	c = C.CString(name)
	// Only names the library accepts are kept (they are at most 39 bytes).
	if err := f(c); err != nil {
		C.free(unsafe.Pointer(c))
		return err
	}
	sectionNames.Lock()
	defer sectionNames.Unlock()
	if _, ok := sectionNames.m[name]; ok || len(sectionNames.m) >= maxCachedSectionNames {
		C.free(unsafe.Pointer(c))
		return nil
	}
	if sectionNames.m == nil {
		sectionNames.m = make(map[string]*C.char)
	}
	sectionNames.m[name] = c
	return nil
}
