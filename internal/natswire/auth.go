// The permission model: which subjects the hub
// and each node's agent may publish and subscribe to, the nkey identities they
// connect with, and the nats-server configuration that grants it.
//
// The model uses plain nkey users with per-user permissions, so it works on a
// stock nats-server (an "authorization { users = [...] }" block) as well as on
// the embedded one in internal/harness/natstest. An agent for node N may only:
//   - create an ordered consumer on the intents stream whose filter is N's
//     keys, and direct-get N's intents and reports by subject;
//   - publish to its own report keys and its own heartbeat key;
//   - receive replies on its own inbox prefix, _INBOX_N;
//   - serve N's console sessions (see AgentPermissions).
//
// It gets no STREAM.INFO: that request takes a subjects filter in its body,
// which subject permissions cannot see, and would list other nodes' keys. The
// agent's bus therefore never binds a KV handle (which needs STREAM.INFO) and
// talks to the streams directly.

package natswire

import (
	"fmt"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	wire "github.com/virtfleet/virtfleet/apis/wire/v1alpha1"
)

// HubName is the identity name of the hub.
const HubName = "hub"

// Permissions are allow lists; everything not listed is denied.
type Permissions struct {
	Publish   []string
	Subscribe []string
}

// User is what the server needs to know about an identity: its public nkey
// and its permissions. It holds no secret.
type User struct {
	// Name is "hub" or the agent's node name; informational only.
	Name        string
	PublicKey   string
	Permissions Permissions
}

// Identity is a User together with its secret seed. It is what an operator
// hands to exactly one agent (or the hub).
type Identity struct {
	User
	// InboxPrefix is the reply-subject prefix the identity may subscribe to.
	InboxPrefix string
	Seed        []byte
}

// InboxPrefix is the private inbox prefix of an identity, one subject token
// whatever the name (wire.NodeToken). A shared _INBOX.> would let any agent
// listen to the replies (intents included) sent to another.
func InboxPrefix(name string) string {
	return "_INBOX_" + wire.NodeToken(name)
}

// AgentPermissions are the permissions of node's agent, named as Kubernetes
// names the node; its keys carry the node's token (wire.NodeToken).
//
// Of the console subjects (wire.ConsoleOpenSubject) the agent may receive
// only its own node's opens and sessions' input, and send only its own
// sessions' output. So it can neither open a console (only the hub, which
// alone may publish opens, can), nor read the keystrokes or the display of
// another node's guest, nor forge another node's output. It may not publish
// to the hub's inbox either: the session subjects carry the answer, so a
// console needs no reply subject.
func AgentPermissions(node string) (Permissions, error) {
	prefix, err := wire.NodeKeyPrefix(node)
	if err != nil {
		return Permissions{}, err
	}
	console, err := wire.ConsoleNodePrefix(node)
	if err != nil {
		return Permissions{}, err
	}
	heartbeat, err := wire.NodeKey(node)
	if err != nil {
		return Permissions{}, err
	}
	// The agent reads its reports from its own stream, which holds
	// nothing else, and never from the bucket that sources every node's.
	intents, reports := wire.Stream(wire.BucketIntents), NodeReportsStream(wire.NodeToken(node))
	ownIntents := wire.Subject(wire.BucketIntents, prefix+">")
	ownReports := wire.Subject(wire.BucketReports, prefix+">")
	ownHeartbeat := wire.Subject(wire.BucketNodes, heartbeat)
	return Permissions{
		Publish: []string{
			// The filter is part of the subject, and the server refuses a
			// body whose filter differs from it, so the agent can only ever
			// consume its own keys.
			"$JS.API.CONSUMER.CREATE." + intents + ".*." + ownIntents,
			"$JS.API.DIRECT.GET." + intents + "." + ownIntents,
			"$JS.API.DIRECT.GET." + reports + "." + ownReports,
			// Listing its own reports, as an agent starting afresh does,
			// is a consumer whose filter is its prefix, as for intents.
			"$JS.API.CONSUMER.CREATE." + reports + ".*." + ownReports,
			"$JS.API.CONSUMER.DELETE." + reports + ".*",
			"$JS.FC." + reports + ".>",
			// Lets the ordered consumer clean up after itself. Consumer names
			// are random and agents cannot list them, so this does not let an
			// agent disturb another's watch.
			"$JS.API.CONSUMER.DELETE." + intents + ".*",
			"$JS.FC." + intents + ".>",
			ownReports,
			ownHeartbeat,
			console + "*.out",
		},
		Subscribe: []string{
			InboxPrefix(node) + ".>",
			console + "open",
			console + "*.in",
		},
	}, nil
}

// HubPermissions are the permissions of the hub: it creates the buckets,
// writes intents, and reads everything. It opens every node's console
// sessions, sends their input and reads their output.
func HubPermissions() Permissions {
	consoles := wire.ConsoleSubjects + ".>"
	return Permissions{
		Publish:   []string{"$JS.API.>", "$JS.FC.>", "$JS.ACK.>", "$KV.>", consoles},
		Subscribe: []string{InboxPrefix(HubName) + ".>", consoles},
	}
}

// NewAgentIdentity mints a fresh identity for node's agent.
func NewAgentIdentity(node string) (Identity, error) {
	perms, err := AgentPermissions(node)
	if err != nil {
		return Identity{}, err
	}
	return newIdentity(node, perms)
}

// NewHubIdentity mints a fresh identity for the hub.
func NewHubIdentity() (Identity, error) {
	return newIdentity(HubName, HubPermissions())
}

func newIdentity(name string, perms Permissions) (Identity, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return Identity{}, errors.Wrap(err, "cannot create user nkey")
	}
	seed, err := kp.Seed()
	if err != nil {
		return Identity{}, errors.Wrap(err, "cannot read nkey seed")
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return Identity{}, errors.Wrap(err, "cannot read nkey public key")
	}
	return Identity{
		User:        User{Name: name, PublicKey: pub, Permissions: perms},
		InboxPrefix: InboxPrefix(name),
		Seed:        seed,
	}, nil
}

// ConnectOptions authenticate as the identity and keep its replies on its
// private inbox prefix.
func (i Identity) ConnectOptions() ([]nats.Option, error) {
	kp, err := nkeys.FromSeed(i.Seed)
	if err != nil {
		return nil, errors.Wrap(err, "cannot parse nkey seed")
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, errors.Wrap(err, "cannot read nkey public key")
	}
	return []nats.Option{
		nats.Nkey(pub, kp.Sign),
		nats.CustomInboxPrefix(i.InboxPrefix),
		nats.Name(i.Name),
	}, nil
}

// ServerConfig renders the users as a nats-server "authorization" block for a
// stock server's configuration file.
func ServerConfig(users ...User) string {
	var b strings.Builder
	b.WriteString("authorization {\n  users = [\n")
	for _, u := range users {
		b.WriteString(u.ServerConfigEntry())
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

// ServerConfigEntry renders one entry of an authorization users list.
func (u User) ServerConfigEntry() string {
	return fmt.Sprintf("    # %s\n    { nkey: %q, permissions: { publish: { allow: %s }, subscribe: { allow: %s } } }\n",
		u.Name, u.PublicKey, quoteList(u.Permissions.Publish), quoteList(u.Permissions.Subscribe))
}

func quoteList(s []string) string {
	q := make([]string, len(s))
	for i, v := range s {
		q[i] = fmt.Sprintf("%q", v)
	}
	return "[" + strings.Join(q, ", ") + "]"
}
