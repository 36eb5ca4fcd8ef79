package rdzv

/*
#include "rdzv.h"
*/
import "C"

import (
	"os"
	"strconv"
	"time"
)

// In-process restart: a worker's side of `rdzv run --in-process-restart`, for training loops
// in Go. When a round ends because the membership changed (a node lost or admitted), the
// launcher asks each healthy worker to leave its training loop instead of stopping it; the
// worker tears down its communicators and calls InProcessNext, which returns its place in the
// next round and sets that round's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...)
// in the process environment. A loop:
//
//	for {
//		round, err := rdzv.InProcessNext(-1)
//		if err != nil { ... }
//		setup(round)
//		for !done && !rdzv.InProcessCheck() { step() }
//		teardown()
//		if done { break }
//	}

// InProcessRound is a worker's place in a round: what torchrun gives a new worker process.
type InProcessRound struct {
	Rank, WorldSize, LocalRank, LocalWorldSize uint32
	GroupRank, GroupWorldSize, RestartCount    uint32
	MasterAddr                                 string
	MasterPort                                 uint16
}

// InProcessEnabled says whether this process runs under `rdzv run --in-process-restart`.
func InProcessEnabled() bool { return bool(C.rdzv_inprocess_enabled()) }

// InProcessCheck says whether the launcher asks this worker to leave its training loop: one
// stat of the control file when nothing changed, so call it every step. False outside
// `--in-process-restart`. Safe for concurrent use.
func InProcessCheck() bool { return bool(C.rdzv_inprocess_check()) }

// InProcessNext tells the launcher the worker has left its round (if it was asked to), then
// waits up to timeout (negative: no bound) for the next round. The first call returns the
// first round at once. ErrTimeout when none came; ErrInvalidArgument outside
// `--in-process-restart`. The round's variables are set in the process environment: all of
// torchrun's in C's (the library's setenv), and those of InProcessRound in Go's too (os.Getenv
// keeps a copy of its own).
func InProcessNext(timeout time.Duration) (InProcessRound, error) {
	var r C.rdzv_inprocess_round_t
	err := call(func(e **C.rdzv_error_t) C.rdzv_status_t {
		return C.rdzv_inprocess_next(timeoutMs(timeout), &r, e)
	})
	if err != nil {
		return InProcessRound{}, err
	}
	round := InProcessRound{
		Rank: uint32(r.rank), WorldSize: uint32(r.world_size),
		LocalRank: uint32(r.local_rank), LocalWorldSize: uint32(r.local_world_size),
		GroupRank: uint32(r.group_rank), GroupWorldSize: uint32(r.group_world_size),
		RestartCount: uint32(r.restart_count),
		MasterAddr:   C.GoString(&r.master_addr[0]),
		MasterPort:   uint16(r.master_port),
	}
	for name, value := range map[string]uint32{
		"RANK": round.Rank, "WORLD_SIZE": round.WorldSize, "LOCAL_RANK": round.LocalRank,
		"LOCAL_WORLD_SIZE": round.LocalWorldSize, "GROUP_RANK": round.GroupRank,
		"GROUP_WORLD_SIZE": round.GroupWorldSize, "TORCHELASTIC_RESTART_COUNT": round.RestartCount,
		"MASTER_PORT": uint32(round.MasterPort),
	} {
		os.Setenv(name, strconv.FormatUint(uint64(value), 10))
	}
	os.Setenv("MASTER_ADDR", round.MasterAddr)
	return round, nil
}
