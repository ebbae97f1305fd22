// Package plugin is kubectl-virtfleet: one cobra command per subresource of
// subresources.virtfleet.io, the kubeconfig flags kubectl has, and VM names
// completed from the namespace.
package plugin

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"github.com/spf13/cobra"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The aggregated API's group and version (hub/internal/subresources).
const (
	group   = "subresources.virtfleet.io"
	version = "v1alpha1"
)

// vms is the resource VM names are completed from.
var vms = schema.GroupVersionResource{Group: "compute.virtfleet.io", Version: "v1alpha1", Resource: "virtualmachines"}

// actions are the subresources that are one PUT each, with what they do.
var actions = []struct{ name, short string }{
	{"start", "Start a stopped VirtualMachine (spec.forProvider.running: true)"},
	{"stop", "Stop a VirtualMachine: ACPI shutdown, forced off after the grace period"},
	{"restart", "Restart a running VirtualMachine's guest (a reboot)"},
	{"reset", "Reset a running VirtualMachine's guest at once, like its reset button"},
	{"pause", "Pause a running VirtualMachine: its vCPUs stop, its memory stays"},
	{"unpause", "Resume a paused VirtualMachine"},
	{"migrate", "Live-migrate a running VirtualMachine to another node the hub chooses"},
}

// env is what every command shares: where the API server is and the
// namespace, from the kubeconfig and kubectl's flags; and the terminal.
type env struct {
	config         clientcmd.ClientConfig
	in             io.Reader
	out, errOut    io.Writer
	interactiveTTY func() bool
}

func (e *env) rest() (*rest.Config, string, error) {
	cfg, err := e.config.ClientConfig()
	if err != nil {
		return nil, "", err
	}
	ns, _, err := e.config.Namespace()
	return cfg, ns, err
}

// Main runs the plugin with args and returns its exit code.
func Main(args []string, in io.Reader, out, errOut io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cmd := newRoot(in, out, errOut)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(errOut, "error:", message(err))
		return 1
	}
	return 0
}

func newRoot(in io.Reader, out, errOut io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "kubectl-virtfleet",
		Short:         "Reach, power and keep virtfleet VirtualMachines: console, vnc, start, stop, restart, reset, pause, unpause, migrate, snapshot, restore",
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl virtfleet"},
	}
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	overrides := &clientcmd.ConfigOverrides{}
	root.PersistentFlags().StringVar(&rules.ExplicitPath, "kubeconfig", "", "Path to the kubeconfig file to use.")
	clientcmd.BindOverrideFlags(overrides, root.PersistentFlags(), clientcmd.RecommendedConfigOverrideFlags(""))
	e := &env{config: clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides), in: in, out: out, errOut: errOut, interactiveTTY: func() bool { return isTerminal(in) }}

	root.AddCommand(e.consoleCommand(), e.vncCommand(), e.snapshotCommand(), e.restoreCommand(), e.cloneCommand(), e.backupCommand())
	for _, a := range actions {
		root.AddCommand(e.actionCommand(a.name, a.short))
	}
	return root
}

// actionCommand PUTs one action subresource.
func (e *env) actionCommand(name, short string) *cobra.Command {
	return &cobra.Command{
		Use:               name + " NAME",
		Short:             short,
		Args:              exactlyOneVM,
		ValidArgsFunction: e.completeVMs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, ns, err := e.rest()
			if err != nil {
				return err
			}
			c, err := restClient(cfg)
			if err != nil {
				return err
			}
			st := &metav1.Status{}
			err = c.Put().AbsPath(subresourcePath(ns, args[0], name)).Do(cmd.Context()).Into(st)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.out, "virtualmachine %s/%s: %s\n", ns, args[0], st.Message)
			return nil
		},
	}
}

func exactlyOneVM(_ *cobra.Command, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("name one VirtualMachine, got %d arguments", len(args))
	}
	return nil
}

// completeVMs offers the namespace's VirtualMachines.
func (e *env) completeVMs(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	cfg, ns, err := e.rest()
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	list, err := dc.Resource(vms).Namespace(ns).List(cmd.Context(), metav1.ListOptions{})
	if err != nil {
		return nil, cobra.ShellCompDirectiveError
	}
	var names []string
	for _, vm := range list.Items {
		if strings.HasPrefix(vm.GetName(), toComplete) {
			names = append(names, vm.GetName())
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

func subresourcePath(ns, name, sub string) string {
	return "/apis/" + group + "/" + version + "/namespaces/" + ns + "/virtualmachines/" + name + "/" + sub
}

// restClient talks to the aggregated API's group.
func restClient(cfg *rest.Config) (*rest.RESTClient, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.GroupVersion = &schema.GroupVersion{Group: group, Version: version}
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = statusCodecs
	return rest.RESTClientFor(cfg)
}

// message is err as a user reads it: the API server's message alone for
// its errors (not found, forbidden, not running), kubectl's way.
func message(err error) string {
	if s, ok := err.(kerrors.APIStatus); ok { //nolint:errorlint // client-go returns them unwrapped
		if m := s.Status().Message; m != "" {
			return m
		}
	}
	return err.Error()
}
