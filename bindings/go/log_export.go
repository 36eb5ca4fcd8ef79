package rdzv

/*
#include "rdzv.h"
*/
import "C"

import (
	"context"
	"log/slog"
)

// rdzvGoLog receives every library record (through the C trampoline in log.go) and hands it
// to the logger set with SetLogger.
//
//export rdzvGoLog
func rdzvGoLog(level C.int, target, line *C.char) {
	logger := logger()
	if logger == nil {
		return
	}
	lvl := slog.LevelDebug
	switch level {
	case C.RDZV_LOG_ERROR:
		lvl = slog.LevelError
	case C.RDZV_LOG_WARN:
		lvl = slog.LevelWarn
	case C.RDZV_LOG_INFO:
		lvl = slog.LevelInfo
	}
	ctx := context.Background()
	if !logger.Enabled(ctx, lvl) {
		return
	}
	logger.Log(ctx, lvl, C.GoString(line), slog.String("target", C.GoString(target)))
}
