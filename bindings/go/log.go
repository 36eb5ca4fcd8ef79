package rdzv

/*
#include "rdzv.h"

extern void rdzvGoLog(int level, char *target, char *line);

static void rdzv_go_log(rdzv_log_level_t level, const char *target, const char *line, void *user_data) {
	(void)user_data;
	rdzvGoLog((int)level, (char *)target, (char *)line);
}

static void rdzv_go_route_logs(void) { rdzv_set_log_handler(rdzv_go_log, NULL); }
*/
import "C"

import (
	"log/slog"
	"sync"
	"sync/atomic"
)

// loggerBox tells "never set" (nil box: slog.Default()) from "set to nil" (drop records).
type loggerBox struct{ logger *slog.Logger }

var (
	currentLogger atomic.Pointer[loggerBox]
	routeOnce     sync.Once
)

// logger is where records go now (nil: nowhere).
func logger() *slog.Logger {
	box := currentLogger.Load()
	if box == nil {
		return slog.Default()
	}
	return box.logger
}

// SetLogger sends the library's log records to logger (slog.Default() until this is called;
// nil drops them). Each record has the library's message ("round sealed"), its fields as
// attributes (run, node, round, ...; integers as Int64) and a "target" attribute naming the
// module that made it. Which records the library makes is set by the RDZV_LOG environment
// variable, read when the process first calls rdzv (default: warnings only; RDZV_LOG=info or
// debug for more). The logger's handler is called on the library's threads, possibly on
// several at once, before the code that made the record goes on; it may call rdzv.
func SetLogger(logger *slog.Logger) {
	currentLogger.Store(&loggerBox{logger: logger})
	routeLogs()
}

// routeLogs points the library at Go's logging, once, at the first call into rdzv.
func routeLogs() {
	routeOnce.Do(func() { C.rdzv_go_route_logs() })
}
