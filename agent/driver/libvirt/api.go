package libvirt

import (
	"io"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	golibvirt "github.com/digitalocean/go-libvirt"
)

// API is the part of go-libvirt the driver uses. *golibvirt.Libvirt satisfies
// it; keeping it narrow shows at a glance which libvirt calls the driver makes.
type API interface {
	ConnectGetCapabilities() (rCapabilities string, err error)
	NodeGetInfo() (rModel [32]int8, rMemory uint64, rCpus int32, rMhz int32, rNodes int32, rSockets int32, rCores int32, rThreads int32, err error)

	ConnectListAllDomains(NeedResults int32, Flags golibvirt.ConnectListAllDomainsFlags) (rDomains []golibvirt.Domain, rRet uint32, err error)
	ConnectGetAllDomainStats(Doms []golibvirt.Domain, Stats uint32, Flags uint32) (rRetStats []golibvirt.DomainStatsRecord, err error)
	DomainLookupByUUID(UUID golibvirt.UUID) (rDom golibvirt.Domain, err error)
	DomainLookupByName(Name string) (rDom golibvirt.Domain, err error)
	DomainDefineXMLFlags(XML string, Flags golibvirt.DomainDefineFlags) (rDom golibvirt.Domain, err error)
	DomainGetXMLDesc(Dom golibvirt.Domain, Flags golibvirt.DomainXMLFlags) (rXML string, err error)
	DomainGetState(Dom golibvirt.Domain, Flags uint32) (rState int32, rReason int32, err error)
	DomainSetMetadata(Dom golibvirt.Domain, Type int32, Metadata golibvirt.OptString, Key golibvirt.OptString, Uri golibvirt.OptString, Flags golibvirt.DomainModificationImpact) (err error)
	DomainCreate(Dom golibvirt.Domain) (err error)
	DomainSuspend(Dom golibvirt.Domain) (err error)
	DomainResume(Dom golibvirt.Domain) (err error)
	DomainReset(Dom golibvirt.Domain, Flags uint32) (err error)
	DomainShutdown(Dom golibvirt.Domain) (err error)
	DomainReboot(Dom golibvirt.Domain, Flags golibvirt.DomainRebootFlagValues) (err error)
	DomainDestroy(Dom golibvirt.Domain) (err error)
	DomainUndefineFlags(Dom golibvirt.Domain, Flags golibvirt.DomainUndefineFlagsValues) (err error)
	DomainInterfaceAddresses(Dom golibvirt.Domain, Source uint32, Flags uint32) (rIfaces []golibvirt.DomainInterface, err error)
	DomainMigratePerform3Params(Dom golibvirt.Domain, Dconnuri golibvirt.OptString, Params []golibvirt.TypedParam, CookieIn []byte, Flags golibvirt.DomainMigrateFlags) (rCookieOut []byte, err error)
	DomainGetJobStats(Dom golibvirt.Domain, Flags golibvirt.DomainGetJobStatsFlags) (rType int32, rParams []golibvirt.TypedParam, err error)
	DomainAbortJob(Dom golibvirt.Domain) error
	DomainFsfreeze(Dom golibvirt.Domain, Mountpoints []string, Flags uint32) (rFilesystems int32, err error)
	DomainSetVcpusFlags(Dom golibvirt.Domain, Nvcpus uint32, Flags uint32) (err error)
	DomainSetMemoryFlags(Dom golibvirt.Domain, Memory uint64, Flags uint32) (err error)
	DomainAttachDeviceFlags(Dom golibvirt.Domain, XML string, Flags uint32) (err error)
	DomainDetachDeviceFlags(Dom golibvirt.Domain, XML string, Flags uint32) (err error)
	DomainBlockResize(Dom golibvirt.Domain, Disk string, Size uint64, Flags golibvirt.DomainBlockResizeFlags) (err error)
	DomainFsthaw(Dom golibvirt.Domain, Mountpoints []string, Flags uint32) (rFilesystems int32, err error)
	// QEMUDomainMonitorCommand runs a QMP command (snapshotlive.go).
	QEMUDomainMonitorCommand(Dom golibvirt.Domain, Cmd string, Flags uint32) (rResult string, err error)

	DomainSnapshotCreateXML(Dom golibvirt.Domain, XMLDesc string, Flags uint32) (rSnap golibvirt.DomainSnapshot, err error)
	DomainSnapshotLookupByName(Dom golibvirt.Domain, Name string, Flags uint32) (rSnap golibvirt.DomainSnapshot, err error)
	DomainSnapshotGetXMLDesc(Snap golibvirt.DomainSnapshot, Flags uint32) (rXML string, err error)
	DomainListAllSnapshots(Dom golibvirt.Domain, NeedResults int32, Flags uint32) (rSnapshots []golibvirt.DomainSnapshot, rRet int32, err error)
	DomainSnapshotDelete(Snap golibvirt.DomainSnapshot, Flags golibvirt.DomainSnapshotDeleteFlags) (err error)
	DomainRevertToSnapshot(Snap golibvirt.DomainSnapshot, Flags uint32) (err error)

	DomainBackupBegin(Dom golibvirt.Domain, BackupXML string, CheckpointXML golibvirt.OptString, Flags golibvirt.DomainBackupBeginFlags) (err error)
	DomainBackupGetXMLDesc(Dom golibvirt.Domain, Flags uint32) (rXML string, err error)
	DomainGetBlockInfo(Dom golibvirt.Domain, Path string, Flags uint32) (rAllocation uint64, rCapacity uint64, rPhysical uint64, err error)
	DomainCheckpointLookupByName(Dom golibvirt.Domain, Name string, Flags uint32) (rCheckpoint golibvirt.DomainCheckpoint, err error)
	DomainCheckpointGetXMLDesc(Checkpoint golibvirt.DomainCheckpoint, Flags uint32) (rXML string, err error)
	DomainListAllCheckpoints(Dom golibvirt.Domain, NeedResults int32, Flags uint32) (rCheckpoints []golibvirt.DomainCheckpoint, rRet int32, err error)
	DomainCheckpointDelete(Checkpoint golibvirt.DomainCheckpoint, Flags golibvirt.DomainCheckpointDeleteFlags) (err error)

	NetworkLookupByName(Name string) (rNet golibvirt.Network, err error)
	NetworkDefineXML(XML string) (rNet golibvirt.Network, err error)
	NetworkCreate(Net golibvirt.Network) (err error)
	NetworkIsActive(Net golibvirt.Network) (rActive int32, err error)
	NetworkGetXMLDesc(Net golibvirt.Network, Flags uint32) (rXML string, err error)
	NetworkGetDhcpLeases(Net golibvirt.Network, Mac golibvirt.OptString, NeedResults int32, Flags uint32) (rLeases []golibvirt.NetworkDhcpLease, rRet uint32, err error)
	NetworkUpdateCompat(Net golibvirt.Network, Command golibvirt.NetworkUpdateCommand, Section golibvirt.NetworkUpdateSection, ParentIndex int32, XML string, Flags golibvirt.NetworkUpdateFlags) (err error)
	NetworkDestroy(Net golibvirt.Network) (err error)
	NetworkUndefine(Net golibvirt.Network) (err error)
	ConnectListAllNetworks(NeedResults int32, Flags golibvirt.ConnectListAllNetworksFlags) (rNets []golibvirt.Network, rRet uint32, err error)

	StoragePoolLookupByName(Name string) (rPool golibvirt.StoragePool, err error)
	StoragePoolGetInfo(Pool golibvirt.StoragePool) (rState uint8, rCapacity uint64, rAllocation uint64, rAvailable uint64, err error)
	StoragePoolRefresh(Pool golibvirt.StoragePool, Flags uint32) (err error)
	StorageVolLookupByName(Pool golibvirt.StoragePool, Name string) (rVol golibvirt.StorageVol, err error)
	StorageVolCreateXML(Pool golibvirt.StoragePool, XML string, Flags golibvirt.StorageVolCreateFlags) (rVol golibvirt.StorageVol, err error)
	StorageVolUpload(Vol golibvirt.StorageVol, outStream io.Reader, Offset uint64, Length uint64, Flags golibvirt.StorageVolUploadFlags) (err error)
	StorageVolDelete(Vol golibvirt.StorageVol, Flags golibvirt.StorageVolDeleteFlags) (err error)
	StorageVolCreateXMLFrom(Pool golibvirt.StoragePool, XML string, Clonevol golibvirt.StorageVol, Flags golibvirt.StorageVolCreateFlags) (rVol golibvirt.StorageVol, err error)
	StorageVolResize(Vol golibvirt.StorageVol, Capacity uint64, Flags golibvirt.StorageVolResizeFlags) (err error)
	StorageVolGetPath(Vol golibvirt.StorageVol) (rName string, err error)
	StorageVolLookupByPath(Path string) (rVol golibvirt.StorageVol, err error)
	StorageVolGetInfo(Vol golibvirt.StorageVol) (rType int8, rCapacity uint64, rAllocation uint64, err error)
	StorageVolGetXMLDesc(Vol golibvirt.StorageVol, Flags uint32) (rXML string, err error)
	StoragePoolListAllVolumes(Pool golibvirt.StoragePool, NeedResults int32, Flags uint32) (rVols []golibvirt.StorageVol, rRet uint32, err error)
}

var _ API = (*golibvirt.Libvirt)(nil)

// libvirtCode returns the libvirt error number of err, or -1 if err did not
// come from libvirt.
func libvirtCode(err error) golibvirt.ErrorNumber {
	var le golibvirt.Error
	if errors.As(err, &le) {
		return golibvirt.ErrorNumber(le.Code)
	}
	return -1
}

func isCode(err error, codes ...golibvirt.ErrorNumber) bool {
	c := libvirtCode(err)
	for _, want := range codes {
		if c == want {
			return true
		}
	}
	return false
}

// permanentCodes are libvirt errors no retry mends: the request itself is
// wrong for this host (say "invalid argument: could not get preferred
// machine for ... type=kvm", or "unsupported configuration: Emulator ...
// does not support machine type ...").
var permanentCodes = []golibvirt.ErrorNumber{
	golibvirt.ErrXMLError, golibvirt.ErrXMLDetail, golibvirt.ErrConfigUnsupported,
	golibvirt.ErrInvalidArg, golibvirt.ErrNoSupport,
}
