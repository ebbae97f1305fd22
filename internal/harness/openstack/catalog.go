package openstack

import (
	"context"
	"fmt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/gophercloud/gophercloud/v2"
	gopenstack "github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"
)

// Clients are the admin's service clients, for tests that look at the
// cloud behind the driver's back.
type Clients struct {
	Provider *gophercloud.ProviderClient
	Identity *gophercloud.ServiceClient
	Compute  *gophercloud.ServiceClient
	Volume   *gophercloud.ServiceClient
	Network  *gophercloud.ServiceClient
	Image    *gophercloud.ServiceClient
}

// Clients authenticates as the cloud's admin. Endpoints missing from the
// catalog (before registerCatalog) are left nil.
func (c *Cloud) Clients(ctx context.Context) (*Clients, error) {
	pc, err := gopenstack.AuthenticatedClient(ctx, gophercloud.AuthOptions{
		IdentityEndpoint: c.AuthURL(), Username: c.Username, Password: c.Password,
		DomainName: c.Domain, TenantName: c.Project, AllowReauth: true,
	})
	if err != nil {
		return nil, errors.Wrap(err, "cannot authenticate as the cloud's admin")
	}
	eo := gophercloud.EndpointOpts{Region: c.Region}
	cl := &Clients{Provider: pc}
	if cl.Identity, err = gopenstack.NewIdentityV3(pc, eo); err != nil {
		return nil, errors.Wrap(err, "no identity endpoint")
	}
	cl.Compute, _ = gopenstack.NewComputeV2(pc, eo)
	cl.Volume, _ = gopenstack.NewBlockStorageV3(pc, eo)
	cl.Network, _ = gopenstack.NewNetworkV2(pc, eo)
	cl.Image, _ = gopenstack.NewImageV2(pc, eo)
	return cl, nil
}

// registerCatalog creates the service project, the service role, a user
// per service (admin and service in the service project: Cinder lets Nova
// detach a volume only with a service token), and the services' endpoints.
func (c *Cloud) registerCatalog(ctx context.Context) error {
	cl, err := c.Clients(ctx)
	if err != nil {
		return err
	}
	id := cl.Identity
	project, err := projects.Create(ctx, id, projects.CreateOpts{Name: serviceProject, DomainID: "default"}).Extract()
	if err != nil {
		return errors.Wrap(err, "cannot create the service project")
	}
	role, err := roles.Create(ctx, id, roles.CreateOpts{Name: serviceRole}).Extract()
	if err != nil {
		return errors.Wrap(err, "cannot create the service role")
	}
	page, err := roles.List(id, roles.ListOpts{Name: "admin"}).AllPages(ctx)
	if err != nil {
		return errors.Wrap(err, "cannot list roles")
	}
	admins, err := roles.ExtractRoles(page)
	if err != nil || len(admins) != 1 {
		return errors.Errorf("no admin role after Keystone's bootstrap (%v)", err)
	}
	for _, name := range []string{"placement", "nova", "glance", "cinder", "neutron"} {
		u, err := users.Create(ctx, id, users.CreateOpts{Name: name, Password: c.Password, DomainID: "default", DefaultProjectID: project.ID}).Extract()
		if err != nil {
			return errors.Wrapf(err, "cannot create user %s", name)
		}
		for _, r := range []string{admins[0].ID, role.ID} {
			if err := roles.Assign(ctx, id, r, roles.AssignOpts{UserID: u.ID, ProjectID: project.ID}).ExtractErr(); err != nil {
				return errors.Wrapf(err, "cannot give user %s its roles", name)
			}
		}
	}
	for _, s := range []struct{ name, typ, url string }{
		{"placement", "placement", fmt.Sprintf("http://127.0.0.1:%d", c.ports.placement)},
		{"nova", "compute", fmt.Sprintf("http://127.0.0.1:%d/v2.1", c.ports.nova)},
		{"glance", "image", c.glanceURL()},
		{"cinderv3", "volumev3", fmt.Sprintf("http://127.0.0.1:%d/v3/%%(project_id)s", c.ports.cinder)},
		{"neutron", "network", fmt.Sprintf("http://127.0.0.1:%d", c.ports.neutron)},
	} {
		svc, err := services.Create(ctx, id, services.CreateOpts{Type: s.typ, Extra: map[string]any{"name": s.name}}).Extract()
		if err != nil {
			return errors.Wrapf(err, "cannot create service %s", s.name)
		}
		for _, a := range []gophercloud.Availability{gophercloud.AvailabilityPublic, gophercloud.AvailabilityInternal, gophercloud.AvailabilityAdmin} {
			if _, err := endpoints.Create(ctx, id, endpoints.CreateOpts{Availability: a, Region: c.Region, URL: s.url, ServiceID: svc.ID}).Extract(); err != nil {
				return errors.Wrapf(err, "cannot create the %s endpoint of %s", a, s.name)
			}
		}
	}
	c.progress("catalog registered")
	return nil
}
