-- Argo CD health check for virtfleet's VirtualMachine (compute.virtfleet.io).
-- Conventions follow Argo CD's own kubevirt.io/VirtualMachine check: a guest
-- that runs is Healthy, one deliberately stopped (spec.forProvider.running:
-- false) is Suspended, anything on its way is Progressing. A Failed guest or
-- a lost node (NodeLost=True) is Degraded.
local function condition(t)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == t then
      return c
    end
  end
  return nil
end

local function message(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  local msg = "Pending deletion"
  if obj.metadata.finalizers ~= nil and #obj.metadata.finalizers > 0 then
    msg = msg .. "; blocked by finalizers: " .. table.concat(obj.metadata.finalizers, ", ")
  end
  return { status = "Progressing", message = msg }
end

-- running defaults to true in the CRD.
local wantRunning = true
if obj.spec ~= nil and obj.spec.forProvider ~= nil and obj.spec.forProvider.running == false then
  wantRunning = false
end

local ready = condition("Ready")
local nodeLost = condition("NodeLost")
if nodeLost ~= nil and nodeLost.status == "True" then
  return { status = "Degraded", message = message(nodeLost, message(ready, "Node lost")) }
end

local phase = nil
if obj.status ~= nil and obj.status.atProvider ~= nil then
  phase = obj.status.atProvider.phase
end
if phase == nil or phase == "" then
  return { status = "Progressing", message = message(ready, "Waiting for the VirtualMachine to be scheduled") }
end

if phase == "Failed" then
  return { status = "Degraded", message = message(ready, "Failed") }
end
if phase == "Running" then
  if wantRunning then
    local rr = condition("RestartRequired")
    if rr ~= nil and rr.status == "True" then
      return { status = "Healthy", message = "Running; restart required to apply the spec" }
    end
    return { status = "Healthy", message = "Running" }
  end
  return { status = "Progressing", message = "Running; stop requested" }
end
if phase == "Stopped" then
  if not wantRunning then
    return { status = "Suspended", message = "Stopped" }
  end
  return { status = "Progressing", message = message(ready, "Stopped; start requested") }
end
if phase == "Pending" or phase == "Scheduled" or phase == "Provisioning" or phase == "Starting"
    or phase == "Stopping" or phase == "Deleting" then
  return { status = "Progressing", message = message(ready, phase) }
end
-- Unknown (without NodeLost) or a phase this script does not know yet.
return { status = "Unknown", message = message(ready, phase) }
