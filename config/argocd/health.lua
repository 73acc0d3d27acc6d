-- Argo CD health of a subflow.dev SubscriptionFlow, read from the conditions and
-- observedGeneration its controller writes (api/v1alpha1/conditions.go). Argo CD opens only the
-- base and table libraries for a script configured in argocd-cm: no string, math or os here.
--
--   Healthy      the flow is in the state its spec declares - Running, or Paused/Stopped by
--                spec.state, a maintenance window or a spec.pauseWhen condition - and every
--                matched consumer reached it
--   Suspended    consumers are halted by something Git does not declare: the on-call override
--                annotation, or another flow's rule holding them
--   Progressing  the controller has not reported this generation yet, or is driving agents
--   Degraded     progress needs a person: Stalled, agents refused the revision, a seek failed,
--                or retention will delete waiting messages while consumption is halted
local hs = {}

local function verdict(status, message)
  hs.status = status
  hs.message = message or ""
  return hs
end

local function condition(conditions, kind)
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function isTrue(c)
  return c ~= nil and c.status == "True"
end

-- What a Ready=False reason means to an Argo CD user; a reason missing here is Progressing,
-- as kstatus reads a Ready=False condition.
local notReady = {
  InvalidSpec = "Degraded",
  AgentAuthFailed = "Degraded",
  AgentTooOld = "Degraded",
  TooManyFlows = "Degraded",
  HeldByOtherRule = "Suspended",
  AgentsUnreachable = "Progressing",
  ConsumersConverging = "Progressing",
  ReleasePending = "Progressing",
  NoMatchingConsumers = "Progressing",
}

-- Why the effective state is in force, for the message.
local decidedBy = {
  Spec = "spec.state",
  Window = "a maintenance window",
  Condition = "spec.pauseWhen",
  Override = "the override annotation subflow.dev/override-state",
}

local meta = obj.metadata or {}
if meta.deletionTimestamp ~= nil then
  return verdict("Progressing", "Deleting: the controller releases the agents' rule first (spec.deletionPolicy)")
end

local status = obj.status
if status == nil or status.conditions == nil or #status.conditions == 0 then
  return verdict("Progressing", "Waiting for the controller to report the flow")
end
local generation = tonumber(meta.generation)
local observed = tonumber(status.observedGeneration)
if generation ~= nil and observed ~= generation then
  return verdict("Progressing", "Waiting for the controller to observe generation " .. generation ..
    " (status describes generation " .. (observed or "none") .. ")")
end

local conditions = status.conditions
local stalled = condition(conditions, "Stalled")
if isTrue(stalled) then
  return verdict("Degraded", stalled.message)
end
local backlog = condition(conditions, "BacklogAtRisk")
if isTrue(backlog) then
  return verdict("Degraded", backlog.message)
end
local seek = condition(conditions, "SeekCompleted")
if seek ~= nil and seek.status == "False" and seek.reason ~= "SeekPending" then
  return verdict("Degraded", seek.message)
end

local ready = condition(conditions, "Ready")
if ready == nil then
  return verdict("Progressing", "Waiting for the controller to report Ready")
end
if ready.status ~= "True" then
  if ready.status == "False" then
    return verdict(notReady[ready.reason] or "Progressing", ready.message)
  end
  return verdict("Progressing", ready.message)
end
if seek ~= nil and seek.status == "False" then
  return verdict("Progressing", seek.message)
end

local effective = status.effectiveState or "Running"
local source = status.stateSource or "Spec"
if effective == "Running" then
  if source == "Override" then
    return verdict("Healthy", "Running by " .. decidedBy.Override .. ": " .. (ready.message or ""))
  end
  return verdict("Healthy", ready.message)
end

local detail = ready.message
local paused = condition(conditions, "Paused")
if isTrue(paused) then
  detail = paused.message
end
if source == "Condition" then
  local auto = condition(conditions, "AutoPaused")
  if isTrue(auto) then
    detail = (auto.message or "") .. "; " .. (detail or "")
  end
end
local message = effective .. " by " .. (decidedBy[source] or source) .. ": " .. (detail or "")
if source == "Window" and status.nextTransitionTime ~= nil then
  message = message .. " (the window ends at " .. status.nextTransitionTime .. ")"
end
if source == "Override" then
  local until_ = (meta.annotations or {})["subflow.dev/override-until"]
  if until_ ~= nil then
    message = message .. " (the override ends at " .. until_ .. ")"
  else
    message = message .. " (until the override is cleared: kubectl subflow clear)"
  end
  return verdict("Suspended", message)
end
return verdict("Healthy", message)
