package nova

import (
	"time"

	"github.com/virtfleet/virtfleet/agent/driver/imageimport"
)

// Config configures the nova backend: the agent fronts one region of an
// OpenStack cloud, and its guests are Nova servers.
type Config struct {
	// Node is the name of the node the agent runs on, reported in
	// Observation.Node.
	Node string
	// CloudsFile is a clouds.yaml; empty means the standard locations
	// (./clouds.yaml, ~/.config/openstack, /etc/openstack) and, when none
	// names Cloud, the OS_* environment variables.
	CloudsFile string
	// Cloud is the entry of CloudsFile to use; empty means OS_CLOUD.
	Cloud string
	// Region overrides the cloud's region_name.
	Region string
	// PollInterval between changes-since list calls; zero means 5 s.
	PollInterval time.Duration
	// Images are the limits of the node's image downloads, which the
	// agent makes before uploading a verified image to Glance.
	Images imageimport.Config
	// ImagePruneInterval is how often images unused for their
	// PruneAfter are deleted from Glance; zero means a minute.
	ImagePruneInterval time.Duration
}
