// Package rdzv is the Go binding of rdzv, a PyTorch-torchelastic-style rendezvous for elastic
// training on etcd v3, over the library's C ABI (include/rdzv.h).
//
// Params describes a rendezvous; NewRendezvous registers this process's node; Next joins the
// next round and returns this node's RoundInfo and the round's Store. Every type has an
// idempotent Close (a finalizer is only a safety net) and is safe for concurrent use: Close
// waits for calls in flight (it wakes a blocked Next first). Failed calls return an *Error
// matching one of the sentinel errors (ErrClosed, ErrTimeout, ...) under errors.Is.
//
// NewAdmin makes an operator's handle on a run that never joins it: Status and Watch read
// the run's RunStatus, CloseRun, Purge and Drain change it.
package rdzv
