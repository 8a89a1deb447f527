//go:build !(linux && amd64)

package inject

import "errors"

// Session is a thread held stopped for calls (x86-64 Linux only).
type Session struct{}

// Do is not supported on this platform.
func Do(tid int, calls []uintptr, fn func(s *Session) error) error { return errors.ErrUnsupported }

// Syscall is not supported on this platform.
func (s *Session) Syscall(nr uintptr, args ...uintptr) (uintptr, error) {
	return 0, errors.ErrUnsupported
}
