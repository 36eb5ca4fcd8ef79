package rdzv

/*
#include "rdzv.h"
*/
import "C"

import "context"

// cancelToken is a C cancel token (rdzv_cancel_token_t), one per blocking call. It stays
// cancelled, so a context that ends just before the C call starts waiting still ends it:
// nothing needs to repeat the cancel.
type cancelToken struct {
	ptr *C.rdzv_cancel_token_t
}

func newCancelToken() (*cancelToken, error) {
	var out *C.rdzv_cancel_token_t
	if err := call(func(e **C.rdzv_error_t) C.rdzv_status_t { return C.rdzv_cancel_token_new(&out, e) }); err != nil {
		return nil, err
	}
	return &cancelToken{ptr: out}, nil
}

// cancel never blocks and is safe from any goroutine.
func (t *cancelToken) cancel() { C.rdzv_cancel_token_cancel(t.ptr, nil) }

func (t *cancelToken) free() { C.rdzv_cancel_token_free(t.ptr) }

// withCancel runs f, a blocking C call made with a new token, and cancels that token as soon
// as ctx is done or closing is closed (nil: never). It returns once f has returned and
// nothing uses the token any more, which it then frees.
func withCancel(ctx context.Context, closing <-chan struct{}, f func(tok *C.rdzv_cancel_token_t) error) error {
	tok, err := newCancelToken()
	if err != nil {
		return err
	}
	defer tok.free()
	return tok.run(ctx, closing, f)
}

// run is withCancel with a token of the caller's: a test cancels it before the call.
func (t *cancelToken) run(ctx context.Context, closing <-chan struct{}, f func(tok *C.rdzv_cancel_token_t) error) error {
	returned, watcher := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watcher)
		select {
		case <-ctx.Done():
			t.cancel()
		case <-closing:
			t.cancel()
		case <-returned:
		}
	}()
	err := f(t.ptr)
	close(returned)
	<-watcher
	return err
}

// withContext runs f, a C call that talks to etcd, with a C cancel token that is cancelled
// as soon as ctx is done or closing is closed (nil: never), and returns its error: when ctx
// ended it, an error matching both ErrCancelled and ctx.Err(). The call always returns before
// withContext does (the library ends it promptly on its token, whatever etcd is doing), so f
// may use its caller's memory. A call that ctx cannot end runs without a token, on the
// caller's goroutine. A write ended by ctx may or may not have been applied.
func withContext(ctx context.Context, closing <-chan struct{}, what string, f func(tok *C.rdzv_cancel_token_t) error) error {
	if err := ctx.Err(); err != nil {
		return &Error{Status: StatusCancelled, Message: "context done before " + what, cause: err}
	}
	if ctx.Done() == nil && closing == nil {
		return f(nil)
	}
	err := withCancel(ctx, closing, f)
	return withCause(ctx, err)
}

// withCause adds ctx.Err() as the cause of an ErrCancelled that ctx made.
func withCause(ctx context.Context, err error) error {
	if e, ok := err.(*Error); ok && e.Status == StatusCancelled && ctx.Err() != nil && e.cause == nil {
		return &Error{Status: StatusCancelled, Message: e.Message, cause: ctx.Err()}
	}
	return err
}
