"""An ML2 mechanism driver that binds every port at once.

The test cloud runs Neutron without agents for its fake compute hosts, so
no mechanism driver of Neutron's own would bind their ports and Nova would
fail the server's network. This one binds each port to its first segment
as an OVS port and marks it ACTIVE; Nova's fake driver plugs nothing and
waits for no event. It comes after Neutron's linuxbridge driver, which
binds the ports of the real compute host, whose linuxbridge agent runs.
"""

from neutron_lib.api.definitions import portbindings
from neutron_lib import constants
from neutron_lib.plugins.ml2 import api


class BindAll(api.MechanismDriver):

    def initialize(self):
        pass

    @property
    def connectivity(self):
        return portbindings.CONNECTIVITY_L2

    def bind_port(self, context):
        for segment in context.segments_to_bind:
            context.set_binding(segment[api.ID], portbindings.VIF_TYPE_OVS,
                                {portbindings.CAP_PORT_FILTER: False},
                                status=constants.PORT_STATUS_ACTIVE)
            return
