package libvirt

import (
	"encoding/xml"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/virtfleet/virtfleet/agent/driver"
)

// resetNamespace marks virtfleet's reset record in a domain's <metadata>.
const resetNamespace = "https://virtfleet.io/xmlns/domain/v1/reset"

// resetKey is the XML prefix libvirt gives the reset record.
const resetKey = "virtfleetreset"

// resetRecord is the last reset nonce a domain handled (driver.Machine's
// ResetNonce), so a restarted agent resets a guest once per nonce. It is an
// element of its own beside ownership: libvirt keys <metadata> elements by
// namespace, and an agent rolled back to one without resets, which rewrites
// ownership as it knows it (dropping fields it does not know), leaves this
// element alone, so the next upgrade does not reset the guest again.
//
// Only the running definition's copy is read, from the XML Ensure reads
// anyway. A redefinition (a changed shape) replaces the next definition's
// metadata and drops the record there; the running guest keeps it, and
// every start writes the nonce the guest starts with first, which counts
// as handled.
//
// It is written unqualified: libvirt puts it in resetNamespace.
type resetRecord struct {
	XMLName   xml.Name `xml:"reset"`
	LastNonce string   `xml:"lastNonce"`
}

// resetOf is the reset nonce the domain whose XML is x last handled;
// empty for none. Most domains have no record, and only those pay for
// reading it.
func resetOf(x string) (string, error) {
	if !strings.Contains(x, resetNamespace) {
		return "", nil
	}
	r := resetRecord{}
	if _, err := findElement(x, xml.Name{Space: resetNamespace, Local: "reset"}, &r); err != nil {
		return "", errors.Wrap(err, "cannot parse the domain's reset record")
	}
	return r.LastNonce, nil
}

// recordReset records nonce as the last reset nonce the domain handled:
// in the running definition, or in the next one when the domain is off
// (which a start then runs with). An empty nonce removes the record: no
// reset is asked for, and the next nonce of any value asks for one.
func recordReset(api API, dom golibvirt.Domain, nonce string) error {
	var record golibvirt.OptString
	if nonce != "" {
		b, err := xml.Marshal(resetRecord{LastNonce: nonce})
		if err != nil {
			return errors.Wrap(err, "cannot marshal the reset record")
		}
		record = golibvirt.OptString{string(b)}
	}
	err := api.DomainSetMetadata(dom, int32(golibvirt.DomainMetadataElement), record, golibvirt.OptString{resetKey}, golibvirt.OptString{resetNamespace}, golibvirt.DomainAffectCurrent)
	return errors.Wrap(err, "cannot write the domain's reset record")
}

// suspend pauses the domain's vCPUs; its memory stays as it is.
func (d *Driver) suspend(api API, dom golibvirt.Domain) error {
	key := formatUUID(dom.UUID)
	d.echoes.expect(key, golibvirt.DomainEventSuspended, d.now())
	if err := api.DomainSuspend(dom); err != nil {
		d.echoes.withdraw(key, golibvirt.DomainEventSuspended)
		return errors.Wrap(err, "cannot pause domain")
	}
	return nil
}

// resume lets a paused domain's vCPUs run again.
func (d *Driver) resume(api API, dom golibvirt.Domain) error {
	key := formatUUID(dom.UUID)
	d.echoes.expect(key, golibvirt.DomainEventResumed, d.now())
	if err := api.DomainResume(dom); err != nil {
		d.echoes.withdraw(key, golibvirt.DomainEventResumed)
		return errors.Wrap(err, "cannot resume domain")
	}
	return nil
}

// reset resets the domain at once, as its reset button does: no ACPI, no
// shutdown inside the guest; a paused domain stays paused. QEMU announces
// the reset with a reboot event, which rebooted would count a second time:
// the reset is recorded as the guest's last start before it is made, so
// that event falls within the same reboot.
func (d *Driver) reset(api API, dom golibvirt.Domain, uid string) error {
	d.stateMu.Lock()
	before, known := d.startedAt[uid]
	d.startedAt[uid] = d.now()
	d.stateMu.Unlock()
	if err := api.DomainReset(dom, 0); err != nil {
		d.stateMu.Lock()
		if known {
			d.startedAt[uid] = before
		} else {
			delete(d.startedAt, uid)
		}
		d.stateMu.Unlock()
		return errors.Wrap(err, "cannot reset domain")
	}
	return nil
}

// start starts the domain. libvirt refusing the start of a definition it
// accepted (firmware the host lacks: "operation failed: Unable to find any
// firmware to satisfy 'efi'") is shown to the user and retried with
// backoff, since installing the missing piece on the host mends it.
func (d *Driver) start(api API, dom golibvirt.Domain, uid string) error {
	at := d.now()
	d.echoes.expect(formatUUID(dom.UUID), golibvirt.DomainEventStarted, at)
	err := api.DomainCreate(dom)
	if err != nil {
		d.echoes.withdraw(formatUUID(dom.UUID), golibvirt.DomainEventStarted)
	}
	if isCode(err, append(permanentCodes, golibvirt.ErrOperationFailed)...) {
		return driver.Failing(errors.Wrap(err, "libvirt cannot start the guest"))
	}
	if err != nil {
		return errors.Wrap(err, "cannot start domain")
	}
	d.started(uid, at)
	return nil
}

// shutdown asks the guest to power off and forces it off once the grace
// period has passed. It never waits: the caller comes back.
func (d *Driver) shutdown(api API, dom golibvirt.Domain, uid string) error {
	d.stateMu.Lock()
	at, asked := d.shutdownAt[uid]
	if !asked {
		d.shutdownAt[uid] = d.now()
	}
	d.stateMu.Unlock()
	if !asked {
		return errors.Wrap(api.DomainShutdown(dom), "cannot shut domain down")
	}
	if d.now().Sub(at) < d.grace {
		return nil
	}
	return d.forceOff(api, dom)
}

// forceOff powers the domain off at once (virsh destroy).
func (d *Driver) forceOff(api API, dom golibvirt.Domain) error {
	err := api.DomainDestroy(dom)
	if isCode(err, golibvirt.ErrOperationInvalid) {
		return nil // already off
	}
	return errors.Wrap(err, "cannot force domain off")
}

func (d *Driver) clearShutdown(uid string) {
	d.stateMu.Lock()
	delete(d.shutdownAt, uid)
	d.stateMu.Unlock()
}

func (d *Driver) shuttingDown(uid string) bool {
	d.stateMu.Lock()
	defer d.stateMu.Unlock()
	_, ok := d.shutdownAt[uid]
	return ok
}
