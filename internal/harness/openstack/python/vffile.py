"""A Cinder volume driver whose volumes are raw files in a directory.

The test cloud has no storage of its own, yet a volume made from an image
must really hold the image, and a hypervisor must one day be able to open
it. Each volume is the sparse file <vffile_directory>/volume-<id> of the
volume's size, a snapshot the file snapshot-<id> beside it. An image is
fetched from Glance and written into the file as raw by Cinder's own
image_utils.fetch_to_raw (qemu-img convert); a volume is uploaded to
Glance (os-volume_upload_image) from its file in place, as LVM's driver
uploads its logical volume. A snapshot is a sparse copy of the file:
unlike an LVM snapshot it is not of one instant when the volume is
written to while it is copied (ext4 has no reflinks), so a test that
snapshots a guest's disk has the guest write nothing meanwhile. A connection hands the file
over as a 'local' device, which is where os-brick and Nova's libvirt driver
find a volume that is a path on the compute host: the file itself, or, for
a host named in vffile_block_device_hosts, a loop device over it. Nova's
libvirt driver makes a 'local' volume a block disk, which QEMU opens only
if it is a block device; the hosts of Nova's fake driver open nothing and
get the file. The loop device is made at the connection's start (once per
file: a second connection gets the same one) and detached at its end, or
when the volume goes.

The commands run here (cp, qemu-img, losetup) run as the service's user,
without Cinder's root helper: cp and qemu-img work on the driver's own
files, and losetup needs root, which the test cloud's services are.
Cinder's own flow runs qemu-img info on the downloaded image "as root"; the
test cloud's services run as root, and oslo.concurrency puts the root
helper (sudo cinder-rootwrap) before a command only for other users.
"""

import os

from oslo_concurrency import lockutils
from oslo_config import cfg
from oslo_utils import units

from cinder.common import constants
from cinder import exception
from cinder.image import image_utils
from cinder.volume import driver
from cinder.volume import volume_utils

file_opts = [
    cfg.StrOpt('vffile_directory',
               help='The directory that holds the volumes, as files.'),
    cfg.ListOpt('vffile_block_device_hosts', default=[],
                help='Compute hosts whose connections get a loop device '
                     'over the volume\'s file rather than the file.'),
]


class FileDriver(driver.VolumeDriver):
    """Volumes as sparse raw files in vffile_directory."""

    VERSION = '1.0'

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.configuration.append_config_values(file_opts)
        self.backend_name = (
            self.configuration.safe_get('volume_backend_name') or 'vffile')

    @property
    def _directory(self):
        return self.configuration.vffile_directory

    def do_setup(self, context):
        if not self._directory:
            raise exception.InvalidConfigurationValue(
                option='vffile_directory', value=self._directory)
        os.makedirs(self._directory, mode=0o700, exist_ok=True)

    def check_for_setup_error(self):
        if not os.access(self._directory, os.W_OK | os.X_OK):
            raise exception.VolumeBackendAPIException(
                data='%s is not a writable directory' % self._directory)

    def local_path(self, volume):
        return os.path.join(self._directory, volume.name)

    def _snapshot_path(self, snapshot):
        return os.path.join(self._directory, snapshot.name)

    @staticmethod
    def _resize(path, size_gb):
        # Growing a file by truncate allocates nothing: the new end reads
        # as zeros.
        os.truncate(path, size_gb * units.Gi)

    def _copy(self, src, dest, size_gb):
        """Copies src to dest keeping holes, then sizes dest to size_gb."""
        self._execute('cp', '--sparse=always', src, dest)
        self._resize(dest, size_gb)

    @staticmethod
    def _remove(path):
        try:
            os.remove(path)
        except FileNotFoundError:
            # A volume that failed before its file was made, or a delete
            # that is retried.
            pass

    def create_volume(self, volume):
        # Emptied first should a failed attempt have left the file behind.
        with open(self.local_path(volume), 'wb'):
            pass
        self._resize(self.local_path(volume), volume.size)

    def delete_volume(self, volume):
        # A new volume is a new file: nothing of this one's data is left to
        # leak into it.
        self._detach_loops(self.local_path(volume))
        self._remove(self.local_path(volume))

    def create_cloned_volume(self, volume, src_vref):
        self._copy(self.local_path(src_vref), self.local_path(volume),
                   volume.size)

    def create_snapshot(self, snapshot):
        self._copy(self.local_path(snapshot.volume),
                   self._snapshot_path(snapshot), snapshot.volume_size)

    def delete_snapshot(self, snapshot):
        self._remove(self._snapshot_path(snapshot))

    def create_volume_from_snapshot(self, volume, snapshot):
        self._copy(self._snapshot_path(snapshot), self.local_path(volume),
                   volume.size)

    def revert_to_snapshot(self, context, volume, snapshot):
        # As LVM's driver merges its snapshot back: the volume's file holds
        # the snapshot's again, in place (cp keeps the inode, so a loop
        # device over it reads the new content), and the snapshot stays.
        self._copy(self._snapshot_path(snapshot), self.local_path(volume),
                   volume.size)

    def extend_volume(self, volume, new_size):
        path = self.local_path(volume)
        self._resize(path, new_size)
        # A loop device keeps the size it had when it was made until told.
        for loop in self._loops(path):
            self._execute('losetup', '--set-capacity', loop)

    def copy_image_to_volume(self, context, volume, image_service, image_id):
        path = self.local_path(volume)
        image_utils.fetch_to_raw(context, image_service, image_id, path,
                                 self.configuration.volume_dd_blocksize,
                                 size=volume.size, run_as_root=False)
        # qemu-img convert makes the file anew, as long as the image's
        # virtual size: the volume is its own size again.
        self._resize(path, volume.size)

    def copy_volume_to_image(self, context, volume, image_service,
                             image_meta):
        volume_utils.upload_volume(context, image_service, image_meta,
                                   self.local_path(volume), volume,
                                   run_as_root=False)

    def ensure_export(self, context, volume):
        pass

    def create_export(self, context, volume, connector):
        pass

    def remove_export(self, context, volume):
        pass

    def initialize_connection(self, volume, connector, **kwargs):
        path = self.local_path(volume)
        hosts = self.configuration.vffile_block_device_hosts or []
        if (connector or {}).get('host') in hosts:
            path = self._loop(path)
        return {'driver_volume_type': 'local',
                'data': {'device_path': path}}

    def terminate_connection(self, volume, connector, **kwargs):
        hosts = self.configuration.vffile_block_device_hosts or []
        # A force detach has no connector: whatever loop there is goes.
        if connector is None or connector.get('host') in hosts:
            self._detach_loops(self.local_path(volume))

    def _loops(self, path):
        """The loop devices over path (losetup -j: "/dev/loopN: ...")."""
        out, _err = self._execute('losetup', '-j', path)
        return [line.split(':', 1)[0] for line in out.splitlines() if line]

    def _loop(self, path):
        with lockutils.lock('vffile-loop-' + os.path.basename(path)):
            loops = self._loops(path)
            if loops:
                return loops[0]
            out, _err = self._execute('losetup', '--find', '--show', path)
            return out.strip()

    def _detach_loops(self, path):
        with lockutils.lock('vffile-loop-' + os.path.basename(path)):
            for loop in self._loops(path):
                self._execute('losetup', '-d', loop)

    def _update_volume_stats(self):
        st = os.statvfs(self._directory)
        provisioned = 0
        for entry in os.scandir(self._directory):
            if entry.is_file():
                provisioned += entry.stat().st_size
        ratio = volume_utils.get_max_over_subscription_ratio(
            self.configuration.max_over_subscription_ratio,
            supports_auto=False)
        # The files are sparse: the backend is thin, and may promise more
        # than the filesystem holds, as far as the over-subscription ratio
        # allows.
        pool = {
            'pool_name': self.backend_name,
            'total_capacity_gb': st.f_blocks * st.f_frsize / units.Gi,
            'free_capacity_gb': st.f_bavail * st.f_frsize / units.Gi,
            'provisioned_capacity_gb': provisioned / units.Gi,
            'reserved_percentage': self.configuration.reserved_percentage,
            'max_over_subscription_ratio': ratio,
            'thin_provisioning_support': True,
            'thick_provisioning_support': False,
            'QoS_support': False,
            'multiattach': False,
        }
        self._stats = {
            'volume_backend_name': self.backend_name,
            'vendor_name': 'virtfleet',
            'driver_version': self.VERSION,
            'storage_protocol': constants.FILE,
            'pools': [pool],
        }
