// Package openstack runs Debian's own OpenStack (Zed, from bookworm's
// packages) as plain processes for tests: Keystone and Placement under
// uwsgi, Nova's API, conductor, scheduler and one compute host with Nova's
// fake.FakeDriver (and a spare one, started when a test enables it to move
// servers live between the two), Glance's API with a file store, Cinder's
// API, scheduler and volume service with a volume driver of the harness's
// own (vffile) whose volumes are sparse raw files, and Neutron's ML2 server
// with a mechanism driver of the harness's own that binds every port
// (there are no agents but the real compute host's, below), on a private
// MariaDB (unix socket) and RabbitMQ (127.0.0.1, random ports).
// Servers exist only in Nova's database, which is all its API shows; a
// volume is a file (VolumePath), and one made from a Glance image holds the
// image's bytes as raw, as a hypervisor would boot it. The driver under
// test meets real Nova, Cinder, Glance, Neutron and Keystone, their
// validation, state machines and asynchrony.
//
// A test that needs a server to be a real guest starts the real compute
// host (StartRealCompute): a nova-compute with Nova's libvirt driver on a
// libvirtd of the cloud's own, QEMU under TCG, with Neutron's linuxbridge
// and DHCP agents for its guests' networks (see realcompute.go for how and
// why).
//
// Nothing is shared with the machine: every service reads its own
// configuration from the cloud's directory, listens on 127.0.0.1 ports
// picked at start, and is stopped (its whole process group) by Stop; what
// a killed test binary's cloud leaves, the next Start removes
// (leftovers.go). The packages are installed by `make deps`
// (hack/deps.sh); Missing says which are absent.
package openstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"golang.org/x/sync/errgroup"

	"github.com/virtfleet/virtfleet/internal/harness/freeport"
	"github.com/virtfleet/virtfleet/internal/harness/procs"
)

// Packages are the Debian packages the cloud runs from; hack/deps.sh
// installs them.
var Packages = []string{
	"mariadb-server", "python3-pymysql", "rabbitmq-server",
	"keystone", "placement-api",
	"nova-api", "nova-conductor", "nova-scheduler", "python3-nova",
	"glance-api",
	"cinder-api", "cinder-scheduler", "cinder-volume",
	"neutron-server", "uwsgi-plugin-python3",
}

// Missing are the Packages not installed.
func Missing() []string {
	var out []string
	for _, p := range Packages {
		st, err := exec.Command("dpkg-query", "-W", "-f=${Status}", p).Output()
		if err != nil || !strings.Contains(string(st), "install ok installed") {
			out = append(out, p)
		}
	}
	return out
}

// Names in the cloud.
const (
	DefaultRegion      = "RegionOne"
	DefaultComputeHost = "vf-compute-1"
	adminUser          = "admin"
	adminProject       = "admin"
	domain             = "Default"
	serviceProject     = "service"
	serviceRole        = "service"
)

// DefaultSpareComputeHost is the name of the second compute host.
const DefaultSpareComputeHost = "vf-compute-2"

// Timeouts generous enough for a small, loaded machine.
const (
	dbTimeout      = 60 * time.Second
	serviceTimeout = 3 * time.Minute
)

// Options configure a Cloud.
type Options struct {
	// Dir holds the cloud's state, configuration and logs; empty means a new
	// temporary directory, removed by Stop.
	Dir string
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
	// ComputeHost is the name of the compute host servers boot on, what a
	// server's OS-EXT-SRV-ATTR:host says; default vf-compute-1.
	ComputeHost string
	// SpareComputeHost is the name of the second compute host; default
	// vf-compute-2.
	SpareComputeHost string
	// RealComputeHost is the name of the compute host with Nova's libvirt
	// driver, which runs once a test starts it (StartRealCompute); default
	// vf-compute-real.
	RealComputeHost string
}

// Cloud is a running OpenStack. Its user is the cloud's admin, in the
// admin project: the driver creates flavors, which Nova's default policy
// allows only admins.
type Cloud struct {
	Dir         string
	Region      string
	Domain      string
	Username    string
	Project     string
	Password    string
	ComputeHost string
	// SpareComputeHost is the name of a second compute host, which runs
	// once a test enables it (SetSpareHostEnabled) to move servers live
	// between the two.
	SpareComputeHost string
	// RealComputeHost is the name of the compute host whose servers are
	// real QEMU guests, which runs once a test starts it
	// (StartRealCompute).
	RealComputeHost string

	ports struct {
		keystone, placement, nova, glance, cinder, neutron, amqp, dist, epmd int
	}
	out    io.Writer
	ownDir bool
	// rec records the cloud for the next Start, should this test binary
	// be killed before Stop.
	rec      *procs.Record
	mu       sync.Mutex
	procs    []*process
	began    time.Time
	stopOnce sync.Once

	// glance is Glance's API, started as soon as its database is ready.
	glance *process

	// spare is the spare compute host's service, once started.
	spareMu sync.Mutex
	spare   *process

	// real is the real compute host, once started, and why its start
	// failed, if it did.
	realMu  sync.Mutex
	real    *realCompute
	realErr error
}

// AuthURL is Keystone's v3 endpoint.
func (c *Cloud) AuthURL() string { return c.keystoneURL() }

func (c *Cloud) keystoneURL() string { return fmt.Sprintf("http://127.0.0.1:%d/v3", c.ports.keystone) }

func (c *Cloud) mysqlSocket() string { return filepath.Join(c.Dir, "mysql.sock") }

func (c *Cloud) glanceURL() string { return fmt.Sprintf("http://127.0.0.1:%d", c.ports.glance) }

func (c *Cloud) volumesDir() string { return filepath.Join(c.Dir, "volumes") }

// VolumePath is the file that is the Cinder volume id: a sparse raw file of
// the volume's size.
func (c *Cloud) VolumePath(id string) string { return filepath.Join(c.volumesDir(), "volume-"+id) }

func (c *Cloud) progress(format string, args ...any) {
	fmt.Fprintf(c.out, "openstack: [%5.1fs] %s\n", time.Since(c.began).Seconds(), fmt.Sprintf(format, args...))
}

// Start starts the whole cloud and returns once every service answers,
// the compute host is in Placement and mapped to a cell, and Cinder's
// scheduler knows the volume backend. On error everything started is
// stopped.
func Start(ctx context.Context, o Options) (_ *Cloud, err error) {
	if missing := Missing(); len(missing) > 0 {
		return nil, errors.Errorf("the Debian packages of the test OpenStack are not installed: %s; run `make deps` as root (hack/deps.sh)", strings.Join(missing, " "))
	}
	c := &Cloud{
		Dir: o.Dir, Region: DefaultRegion, Domain: domain, Username: adminUser, Project: adminProject,
		ComputeHost: o.ComputeHost, SpareComputeHost: o.SpareComputeHost, RealComputeHost: o.RealComputeHost,
		out: o.Progress, began: time.Now(),
	}
	if c.RealComputeHost == "" {
		c.RealComputeHost = DefaultRealComputeHost
	}
	if c.out == nil {
		c.out = io.Discard
	}
	if c.ComputeHost == "" {
		c.ComputeHost = DefaultComputeHost
	}
	if c.SpareComputeHost == "" {
		c.SpareComputeHost = DefaultSpareComputeHost
	}
	if err := removeLeftovers(ctx, c.out); err != nil {
		// The new cloud shares nothing with theirs; the next Start retries.
		c.progress("%v", err)
	}
	if c.Dir == "" {
		if c.Dir, err = os.MkdirTemp("", dirPrefix); err != nil {
			return nil, errors.Wrap(err, "cannot create the cloud's directory")
		}
		c.ownDir = true
	}
	if c.rec, err = procs.WriteRecord(runDir(), recordName(c.Dir), record{Dir: c.Dir, Keep: !c.ownDir, Owner: os.Getpid()}); err != nil {
		if c.ownDir {
			_ = os.RemoveAll(c.Dir)
		}
		return nil, err
	}
	var secret [16]byte
	_, _ = rand.Read(secret[:])
	c.Password = hex.EncodeToString(secret[:])
	defer func() {
		if err != nil {
			// The logs say why.
			c.ownDir = false
			c.Stop()
			c.progress("start failed; state and logs kept in %s", c.Dir)
		}
	}()
	if err := c.prepare(); err != nil {
		return nil, err
	}
	c.progress("state in %s", c.Dir)

	if err := c.writeConfigs(); err != nil {
		return nil, err
	}
	// MariaDB and RabbitMQ come first, then the databases (migrated, or
	// loaded from the machine's template of a migration done before),
	// Keystone and its catalog, then everything else. Glance starts as
	// soon as its database is there: it needs neither RabbitMQ nor Keystone
	// to start, so its start overlaps theirs instead of adding to the
	// services' (startServices waits for it).
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := c.startMariaDB(gctx); err != nil {
			return err
		}
		if err := c.databases(gctx); err != nil {
			return err
		}
		return c.startGlance()
	})
	g.Go(func() error { return c.startRabbitMQ(gctx) })
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := c.startKeystone(ctx); err != nil {
		return nil, err
	}
	if err := c.registerCatalog(ctx); err != nil {
		return nil, err
	}
	if err := c.startServices(ctx); err != nil {
		return nil, err
	}
	c.progress("cloud ready: Keystone %s, compute host %s", c.AuthURL(), c.ComputeHost)
	return c, nil
}

// prepare makes the directory tree and the ports.
func (c *Cloud) prepare() error {
	for _, d := range []string{"logs", "etc", "home", "python", "mysql", "rabbitmq",
		"state/keystone/fernet-keys", "state/keystone/credential-keys",
		"state/nova/instances", "state/nova/lock", "state/cinder/lock", "state/neutron/lock",
		"state/glance/lock", "state/glance/images", "state/glance/staging", "volumes"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o700); err != nil {
			return errors.Wrap(err, "cannot create the cloud's directories")
		}
	}
	for _, p := range []*int{&c.ports.keystone, &c.ports.placement, &c.ports.nova, &c.ports.cinder,
		&c.ports.neutron, &c.ports.amqp, &c.ports.dist, &c.ports.epmd, &c.ports.glance} {
		port, err := freeport.Pick()
		if err != nil {
			return err
		}
		*p = port
	}
	return c.writePython()
}

// Stop stops every service and removes the directory
// if Start made it. It may be called more than once.
func (c *Cloud) Stop() {
	c.stopOnce.Do(func() {
		// The real host's guests first, while its libvirtd still runs.
		c.realMu.Lock()
		rc := c.real
		c.realMu.Unlock()
		if rc != nil {
			rc.destroyGuests(c)
		}
		c.mu.Lock()
		running := c.procs
		c.procs = nil
		c.mu.Unlock()
		// All at once: each may take its grace period, and they no longer
		// need each other.
		var wg sync.WaitGroup
		for _, p := range running {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.stop()
			}()
		}
		wg.Wait()
		if len(running) > 0 {
			c.progress("stopped %d processes", len(running))
		}
		// What left its service's process group (Erlang's helpers, QEMU,
		// dnsmasq) and did not end with it.
		killed, err := killCloud(context.Background(), c.Dir)
		if len(killed) > 0 {
			c.progress("killed %d processes left: %s", len(killed), strings.Join(killed, ", "))
		}
		if err != nil {
			c.progress("%v", err)
		}
		if rc != nil {
			rc.cleanUp(c)
		}
		if c.ownDir {
			_ = os.RemoveAll(c.Dir)
		}
		if c.rec != nil {
			c.rec.Remove()
		}
	})
}
