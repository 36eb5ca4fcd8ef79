package rdzv

/*
#include <stdlib.h>
#include "rdzv.h"
*/
import "C"

import "errors"

// Status is a C status code (rdzv_status_t). Values never change.
type Status int

// The status codes of include/rdzv.h.
const (
	StatusOK              Status = C.RDZV_OK
	StatusInvalidArgument Status = C.RDZV_ERR_INVALID_ARGUMENT
	StatusClosed          Status = C.RDZV_ERR_CLOSED
	StatusTimeout         Status = C.RDZV_ERR_TIMEOUT
	StatusConnection      Status = C.RDZV_ERR_CONNECTION
	StatusState           Status = C.RDZV_ERR_STATE
	StatusGracefulExit    Status = C.RDZV_ERR_GRACEFUL_EXIT
	StatusShutdown        Status = C.RDZV_ERR_SHUTDOWN
	StatusInternal        Status = C.RDZV_ERR_INTERNAL
	StatusCancelled       Status = C.RDZV_ERR_CANCELLED
)

// String is the C name of the status, e.g. "RDZV_ERR_TIMEOUT".
func (s Status) String() string {
	// rdzv_status_name takes any int and names unknown values "RDZV_ERR_UNKNOWN".
	return C.GoString(C.rdzv_status_name(C.int32_t(s)))
}

// Sentinel errors, one per failure status, for errors.Is. Every error this package returns
// for a failed call is an *Error that matches the sentinel of its status.
var (
	ErrInvalidArgument = errors.New("rdzv: invalid argument")
	ErrClosed          = errors.New("rdzv: rendezvous closed")
	ErrTimeout         = errors.New("rdzv: timeout")
	ErrConnection      = errors.New("rdzv: connection error")
	ErrState           = errors.New("rdzv: corrupt rendezvous state")
	ErrGracefulExit    = errors.New("rdzv: graceful exit")
	ErrShutdown        = errors.New("rdzv: handle shut down")
	ErrInternal        = errors.New("rdzv: internal error")
	ErrCancelled       = errors.New("rdzv: cancelled")
)

var sentinels = map[Status]error{
	StatusInvalidArgument: ErrInvalidArgument,
	StatusClosed:          ErrClosed,
	StatusTimeout:         ErrTimeout,
	StatusConnection:      ErrConnection,
	StatusState:           ErrState,
	StatusGracefulExit:    ErrGracefulExit,
	StatusShutdown:        ErrShutdown,
	StatusInternal:        ErrInternal,
	StatusCancelled:       ErrCancelled,
}

// Error is a failed call: its status and the library's message. errors.Is(err, ErrTimeout)
// and the like match on Status. A Next stopped by its context also unwraps to the context's
// error, so errors.Is(err, context.Canceled) holds as well as errors.Is(err, ErrCancelled).
type Error struct {
	Status  Status
	Message string
	cause   error
}

func (e *Error) Error() string {
	s := "rdzv: " + e.Status.String()
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.cause != nil {
		s += " (" + e.cause.Error() + ")"
	}
	return s
}

// Is reports whether target is the sentinel of e's status.
func (e *Error) Is(target error) bool {
	s, ok := sentinels[e.Status]
	return ok && s == target
}

// Unwrap returns the context error that cancelled a Next, or nil.
func (e *Error) Unwrap() error { return e.cause }

// call runs one C call with an error slot and turns a failure into an *Error. The message is
// read from the rdzv_error_t the call itself returned (never a thread-local: the goroutine may
// have moved to another OS thread), and that error is always freed.
func call(f func(errOut **C.rdzv_error_t) C.rdzv_status_t) error {
	var cerr *C.rdzv_error_t
	status := f(&cerr)
	if cerr == nil && status == C.RDZV_OK {
		return nil
	}
	msg := ""
	if cerr != nil {
		msg = C.GoString(C.rdzv_error_message(cerr))
		C.rdzv_error_free(cerr)
	}
	if status == C.RDZV_OK {
		return nil
	}
	return &Error{Status: Status(status), Message: msg}
}

// errClosedHandle is what every call on a closed handle returns, in every binding: the
// library's SHUTDOWN status (errors.Is(err, ErrShutdown)).
func errClosedHandle(what string) error {
	return &Error{Status: StatusShutdown, Message: "use of closed " + what}
}

// Version is the version of the loaded C library ("MAJOR.MINOR.PATCH").
func Version() string { return C.GoString(C.rdzv_version()) }
