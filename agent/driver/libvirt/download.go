package libvirt

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"
	"github.com/digitalocean/go-libvirt/socket/dialers"
)

// Volume downloads (virStorageVolDownload) go over a connection of their
// own, which speaks libvirt's RPC protocol through go-libvirt's socket
// package, not through go-libvirt's StorageVolDownload: that takes the
// first packet of the call's serial for the call's reply, but libvirtd
// queues the stream's first data from its event loop while its worker is
// still to send the reply, so the data can come first. go-libvirt then
// drops that data, takes the reply that follows for the stream's end, and
// blocks its connection for good on the stream packets still coming (its
// router holds its lock while it hands a packet to a call that has
// returned). Found by the backup tests: reads of a volume came short, now
// and then, and one hung. Here a packet is told by its type: the reply,
// the stream's data, its end.

// Procedures and values of libvirt's remote protocol (remote_protocol.x).
const (
	rpcProgram         = 0x20008086
	procConnectOpen    = 1
	procAuthPolkit     = 70
	procAuthList       = 66
	procVolumeDownload = 209
	authPolkit         = 2
	// rpcTimeout bounds a call's reply, and each packet of a stream.
	rpcTimeout = time.Minute
)

// downloads is a connection to libvirtd for volume downloads: one at a
// time.
type downloads struct {
	sock   *socket.Socket
	in     chan rpcPacket
	closed chan struct{}
	once   sync.Once
	serial int32
	// dataBeforeReply counts the downloads whose data came before their
	// reply: what go-libvirt's own download gets wrong.
	dataBeforeReply int
}

// rpcPacket is one packet libvirtd sent.
type rpcPacket struct {
	header socket.Header
	body   []byte
}

// dialDownloads opens a connection to the libvirtd at path for uri.
func dialDownloads(path, uri string) (*downloads, error) {
	c := &downloads{in: make(chan rpcPacket, 16), closed: make(chan struct{})}
	c.sock = socket.New(dialers.NewLocal(dialers.WithSocket(path), dialers.WithLocalTimeout(5*time.Second)), c)
	if err := c.sock.Connect(); err != nil {
		return nil, errors.Wrapf(err, "cannot reach libvirtd on %s for a download", path)
	}
	if err := c.open(uri); err != nil {
		_ = c.Close()
		return nil, errors.Wrapf(err, "cannot open %s for a download", uri)
	}
	return c, nil
}

// open authenticates as go-libvirt does (libvirtd wants the list asked
// for, even where it needs none) and opens uri.
func (c *downloads) open(uri string) error {
	reply, err := c.call(procAuthList, nil)
	if err != nil {
		return err
	}
	r := xdrReader{b: reply}
	for n := r.uint32(); n > 0 && r.err == nil; n-- {
		if r.uint32() == authPolkit {
			if _, err := c.call(procAuthPolkit, nil); err != nil {
				return err
			}
			break
		}
	}
	if r.err != nil {
		return r.err
	}
	var args xdrWriter
	args.uint32(1) // the name is there
	args.string(uri)
	args.uint32(0) // flags
	_, err = c.call(procConnectOpen, args.Bytes())
	return err
}

// Route implements socket.Router: every packet goes to the call waiting
// for it, or nowhere once the connection is closed.
func (c *downloads) Route(h *socket.Header, body []byte) {
	select {
	case c.in <- rpcPacket{header: *h, body: body}:
	case <-c.closed:
	}
}

// Close closes the connection, and a download cut short with it.
func (c *downloads) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.sock.Disconnect()
}

// next is the next packet of the call with serial, within rpcTimeout.
func (c *downloads) next(ctx context.Context, serial int32) (rpcPacket, error) {
	t := time.NewTimer(rpcTimeout)
	defer t.Stop()
	for {
		select {
		case p := <-c.in:
			if p.header.Serial == serial {
				return p, nil
			}
			// A packet of an earlier call cut short: not this one's.
		case <-ctx.Done():
			return rpcPacket{}, ctx.Err()
		case <-t.C:
			return rpcPacket{}, errors.New("libvirtd did not answer")
		case <-c.sock.Disconnected():
			return rpcPacket{}, errors.New("the connection to libvirtd was lost")
		}
	}
}

// call makes a call and returns its reply.
func (c *downloads) call(proc uint32, args []byte) ([]byte, error) {
	c.serial++
	if err := c.sock.SendPacket(c.serial, proc, rpcProgram, args, socket.Call, socket.StatusOK); err != nil {
		return nil, err
	}
	for {
		p, err := c.next(context.Background(), c.serial)
		if err != nil {
			return nil, err
		}
		switch {
		case p.header.Status == socket.StatusError:
			return nil, rpcError(p.body)
		case p.header.Type == socket.Reply:
			return p.body, nil
		}
	}
}

// download writes length bytes of vol from offset to w, or what there is
// of them before the volume's end. On an error the connection is left in
// no state to be used again: the caller closes it.
func (c *downloads) download(ctx context.Context, vol golibvirt.StorageVol, offset, length uint64, w io.Writer) error {
	var args xdrWriter
	args.string(vol.Pool)
	args.string(vol.Name)
	args.string(vol.Key)
	args.uint64(offset)
	args.uint64(length)
	args.uint32(0) // flags: no holes
	c.serial++
	serial := c.serial
	if err := c.sock.SendPacket(serial, procVolumeDownload, rpcProgram, args.Bytes(), socket.Call, socket.StatusOK); err != nil {
		return err
	}
	replied, ended, early := false, false, false
	for !replied || !ended {
		p, err := c.next(ctx, serial)
		if err != nil {
			return err
		}
		switch {
		case p.header.Status == socket.StatusError:
			return rpcError(p.body)
		case p.header.Type == socket.Reply:
			replied = true
		case p.header.Type != socket.Stream:
		case p.header.Status == socket.StatusOK:
			// libvirtd's confirmation of the finish below.
			ended = true
		case len(p.body) > 0:
			early = early || !replied
			if _, err := w.Write(p.body); err != nil {
				return err
			}
		default:
			// The stream's end: finished as libvirt's own client does.
			if err := c.sock.SendPacket(serial, procVolumeDownload, rpcProgram, nil, socket.Stream, socket.StatusOK); err != nil {
				return err
			}
		}
	}
	if early {
		c.dataBeforeReply++
	}
	return nil
}

// rpcError decodes libvirt's remote_error as the golibvirt.Error
// go-libvirt returns, so that isCode tells it.
func rpcError(body []byte) error {
	r := xdrReader{b: body}
	code := r.uint32()
	_ = r.uint32() // domain
	var msg string
	if r.uint32() != 0 {
		msg = r.string()
	}
	if r.err != nil {
		return errors.Wrap(r.err, "cannot decode libvirt's error")
	}
	return golibvirt.Error{Code: code, Message: msg}
}

// xdrWriter encodes the XDR of a call's arguments.
type xdrWriter struct{ bytes.Buffer }

func (w *xdrWriter) uint32(v uint32) { _ = binary.Write(w, binary.BigEndian, v) }
func (w *xdrWriter) uint64(v uint64) { _ = binary.Write(w, binary.BigEndian, v) }

func (w *xdrWriter) string(s string) {
	w.uint32(uint32(len(s))) //nolint:gosec // names are short
	w.WriteString(s)
	w.Write(make([]byte, (4-len(s)%4)%4))
}

// xdrReader decodes the XDR of a reply; err says the first thing that was
// not there.
type xdrReader struct {
	b   []byte
	err error
}

func (r *xdrReader) uint32() uint32 {
	if len(r.b) < 4 {
		r.err = io.ErrUnexpectedEOF
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *xdrReader) string() string {
	n := int(r.uint32())
	padded := n + (4-n%4)%4
	if r.err != nil || len(r.b) < padded {
		r.err = io.ErrUnexpectedEOF
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[padded:]
	return s
}
