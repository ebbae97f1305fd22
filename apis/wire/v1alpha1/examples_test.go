package v1alpha1

import "time"

// Real-looking messages, shared by the table tests and as fuzz seeds.

var observed = time.Date(2026, 11, 3, 10, 0, 0, 0, time.UTC)

func exampleIntent() Intent {
	return Intent{
		ProtocolVersion: ProtocolVersion,
		UID:             "6f1c2d9e-0b7a-4e43-9a51-3c0f4d8e2a17",
		Namespace:       "team-a",
		Name:            "db-0",
		Generation:      3,
		Running:         true,
		RestartNonce:    "2026-11-03T09:59:00Z",
		Machine: Machine{
			VCPU: 2, MemoryBytes: 4 << 30, SwapBytes: 1 << 30,
			PublicKey: "ssh-ed25519 AAAAC3Nza user@host",
			UserData:  "#cloud-config\npackages: [postgresql]\n",
			Firmware:  FirmwareUEFI,
			Disks: []Disk{{
				Name: "root", VolumeUID: "9a3e0c1b-1111-4c2d-8e3f-000000000001", SizeBytes: 20 << 30,
				Image: &ImageRef{Name: "debian-13", UID: "img-1", URL: "https://cloud.debian.org/d13.qcow2", Format: "qcow2"},
			}},
			Networks: []Network{{Name: "net-db", UID: "net-1", Mode: "nat", CIDR: "10.10.120.0/24"}},
		},
		Backend: BackendParams{Type: "libvirt"},
	}
}

// exampleClonedIntent boots from a copy of another Volume's disk.
func exampleClonedIntent() Intent {
	in := exampleIntent()
	in.Machine.Disks = []Disk{{
		Name: "root-2", VolumeUID: "9a3e0c1b-1111-4c2d-8e3f-000000000002", SizeBytes: 20 << 30,
		Image: &ImageRef{Name: "golden", UID: "img-2", Format: "qcow2", PruneAfterSeconds: 3600,
			SourceVolume: &SourceVolume{Name: "root", UID: "9a3e0c1b-1111-4c2d-8e3f-000000000001"}},
	}}
	return in
}

func exampleReport() Report {
	return Report{
		ProtocolVersion:    ProtocolVersion,
		UID:                "6f1c2d9e-0b7a-4e43-9a51-3c0f4d8e2a17",
		ObservedGeneration: 3,
		Phase:              PhaseRunning,
		ID:                 "6f1c2d9e-0b7a-4e43-9a51-3c0f4d8e2a17",
		Node:               "node1",
		Interfaces: []Interface{{
			Network: "net-db", MAC: "52:54:00:12:34:56", IPs: []string{"10.10.120.21"},
			Source: AddressSourceLease, LastSeen: observed,
		}},
		RestartCount: 1,
		ObservedAt:   observed,
	}
}

func exampleHeartbeat() NodeHeartbeat {
	return NodeHeartbeat{
		ProtocolVersion: ProtocolVersion,
		Node:            "node1",
		Backend:         "libvirt",
		Capacity:        Resources{VCPU: 16, MemoryBytes: 64 << 30, StorageBytes: 1 << 40},
		Allocated:       Resources{VCPU: 2, MemoryBytes: 4 << 30},
		Labels:          map[string]string{"zone": "a"},
		AgentVersion:    "v0.1.0",
		SentAt:          observed,
	}
}

func exampleVolumeIntent() VolumeIntent {
	return VolumeIntent{
		ProtocolVersion: ProtocolVersion,
		UID:             "9a3e0c1b-1111-4c2d-8e3f-000000000001",
		Namespace:       "team-a",
		Name:            "root",
		Disk:            NameOnNode("team-a", "root"),
		Absent:          true,
	}
}

// exampleImportIntent imports the node's volume "legacy.qcow2".
func exampleImportIntent() VolumeIntent {
	return VolumeIntent{
		ProtocolVersion: ProtocolVersion,
		UID:             "9a3e0c1b-1111-4c2d-8e3f-000000000002",
		Namespace:       "team-a",
		Name:            "legacy",
		Disk:            "legacy.qcow2",
		ExternalName:    "legacy.qcow2",
	}
}

func exampleImportReport() VolumeReport {
	return VolumeReport{
		ProtocolVersion: ProtocolVersion,
		UID:             "9a3e0c1b-1111-4c2d-8e3f-000000000002",
		Imported:        true,
		SizeBytes:       5 << 30,
		ID:              "/var/lib/libvirt/images/legacy.qcow2",
		ObservedAt:      observed,
	}
}

func exampleVolumeReport() VolumeReport {
	return VolumeReport{
		ProtocolVersion: ProtocolVersion,
		UID:             "9a3e0c1b-1111-4c2d-8e3f-000000000001",
		Message:         "volume team-a_root is attached to guest 6f1c2d9e",
		ObservedAt:      observed,
	}
}

func exampleImageReport() ImageReport {
	return ImageReport{
		ProtocolVersion: ProtocolVersion,
		UID:             "img-1",
		Name:            "debian-13",
		Node:            "node1",
		Phase:           ImagePhaseReady,
		SizeBytes:       512 << 20,
		ObservedAt:      observed,
	}
}
