package driver

import (
	"fmt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// notFound marks an error as "the guest does not exist".
type notFound struct{ error }

func (e notFound) Unwrap() error { return e.error }

// terminal marks an error as "this input can never succeed".
type terminal struct{ error }

func (e terminal) Unwrap() error { return e.error }

// failing marks an error as "shown to the user, and retried".
type failing struct{ error }

func (e failing) Unwrap() error { return e.error }

// Failing marks err as one the user must see (the guest is reported Failed
// with its message) although it may pass by itself, so it is retried with
// backoff. A nil err stays nil.
func Failing(err error) error {
	if err == nil {
		return nil
	}
	return failing{err}
}

// Failingf returns a Failing error with a formatted message.
func Failingf(format string, args ...any) error {
	return failing{fmt.Errorf(format, args...)}
}

// IsFailing reports whether err, or any error it wraps, is Failing.
func IsFailing(err error) bool {
	var f failing
	return errors.As(err, &f)
}

// NotFound marks err as meaning the guest does not exist. A nil err stays nil.
func NotFound(err error) error {
	if err == nil {
		return nil
	}
	return notFound{err}
}

// NotFoundf returns a NotFound error with a formatted message.
func NotFoundf(format string, args ...any) error {
	return notFound{fmt.Errorf(format, args...)}
}

// Terminal marks err as not worth retrying: its message is shown to the user,
// who has to change the input. A nil err stays nil.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return terminal{err}
}

// Terminalf returns a Terminal error with a formatted message the user can
// act on.
func Terminalf(format string, args ...any) error {
	return terminal{fmt.Errorf(format, args...)}
}

// IsNotFound reports whether err, or any error it wraps, is NotFound.
func IsNotFound(err error) bool {
	var nf notFound
	return errors.As(err, &nf)
}

// IsTerminal reports whether err, or any error it wraps, is Terminal.
func IsTerminal(err error) bool {
	var t terminal
	return errors.As(err, &t)
}

// inUse marks an error as "the volume is attached to a guest".
type inUse struct{ error }

func (e inUse) Unwrap() error { return e.error }

// InUsef returns an error satisfying IsInUse: the volume cannot be deleted
// while a guest has it attached. It is retryable.
func InUsef(format string, args ...any) error {
	return inUse{fmt.Errorf(format, args...)}
}

// IsInUse reports whether err, or any error it wraps, says a volume is
// attached to a guest.
func IsInUse(err error) bool {
	var u inUse
	return errors.As(err, &u)
}
