package rdzv

/*
#include "rdzv.h"
*/
import "C"

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
)

// rdzvGoLog receives every library record (through the C trampoline in log.go) and hands it
// to the logger set with SetLogger. It runs on the library's threads; a panicking handler
// loses its record but cannot take the process down.
//
//export rdzvGoLog
func rdzvGoLog(level C.int, target, line *C.char) {
	defer func() { _ = recover() }()
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
	msg, attrs := splitLine(C.GoString(line))
	attrs = append(attrs, slog.String("target", C.GoString(target)))
	logger.LogAttrs(ctx, lvl, msg, attrs...)
}

// splitLine separates a record's line ("round sealed run=job-7 round=0 ...") into its
// message and its fields, as slog attributes: integers and booleans typed, other values as
// strings (the library double-quotes values that hold spaces, quotes or '=').
func splitLine(line string) (string, []slog.Attr) {
	start := len(line)
	for i := 0; i < len(line); i++ {
		if (i == 0 || line[i-1] == ' ') && isFieldStart(line[i:]) {
			start = i
			break
		}
	}
	msg := strings.TrimRight(line[:start], " ")
	var attrs []slog.Attr
	rest := line[start:]
	for rest != "" {
		eq := strings.IndexByte(rest, '=')
		if eq <= 0 {
			break
		}
		name, value := rest[:eq], rest[eq+1:]
		var raw string
		if strings.HasPrefix(value, `"`) {
			end := closingQuote(value)
			raw, rest = value[:end], value[end:]
			if unquoted, err := strconv.Unquote(raw); err == nil {
				raw = unquoted
			} else {
				raw = strings.Trim(raw, `"`)
			}
		} else {
			end := strings.IndexByte(value, ' ')
			if end < 0 {
				end = len(value)
			}
			raw, rest = value[:end], value[end:]
		}
		attrs = append(attrs, typed(name, raw))
		rest = strings.TrimLeft(rest, " ")
	}
	return msg, attrs
}

// isFieldStart tells whether s starts with "name=" (name: lower-case letters, digits, '_').
func isFieldStart(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '=':
			return i > 0
		case c >= 'a' && c <= 'z', c == '_', i > 0 && c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return false
}

// closingQuote returns the index just past the quote that closes the string starting at s[0].
func closingQuote(s string) int {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(s)
}

func typed(name, value string) slog.Attr {
	if n, err := strconv.ParseInt(value, 10, 64); err == nil {
		return slog.Int64(name, n)
	}
	if b, err := strconv.ParseBool(value); err == nil && (value == "true" || value == "false") {
		return slog.Bool(name, b)
	}
	return slog.String(name, value)
}
