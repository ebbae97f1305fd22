"""oslo.service's ProcessLauncher as the test cloud runs it.

A service that forks workers (nova-api, cinder-api, cinder-volume: their
mains always use a ProcessLauncher, even for one worker) keeps a parent
that looks for dead workers to respawn every wait_interval, 0.01 s unless
the service says otherwise, which no configuration option changes: a
hundred wake-ups a second per parent, the busiest thing an idle test cloud
does. Neutron's server passes 1 s itself; patch() makes that every
service's. The cloud loses nothing a test needs: its workers do not die,
and a parent stopped by SIGTERM notices within the interval, well inside
the harness's grace period.
"""

from oslo_service import service

WAIT_INTERVAL = 1.0


def patch():
    init = service.ProcessLauncher.__init__

    def __init__(self, conf, wait_interval=None, restart_method='reload'):
        init(self, conf, wait_interval=WAIT_INTERVAL, restart_method=restart_method)

    service.ProcessLauncher.__init__ = __init__
