-- Argo CD resource actions of a subflow.dev SubscriptionFlow: pause, resume and stop set
-- spec.state (absent means Running, the CRD's default). Each action is offered only when it
-- changes spec.state; resume only when spec.state is Paused or Stopped.
local state = "Running"
if obj.spec ~= nil and obj.spec.state ~= nil then
  state = obj.spec.state
end
local actions = {}
actions["pause"] = {["disabled"] = state == "Paused", ["iconClass"] = "fa fa-fw fa-pause", ["displayName"] = "Pause (spec.state)"}
actions["resume"] = {["disabled"] = state == "Running", ["iconClass"] = "fa fa-fw fa-play", ["displayName"] = "Resume (spec.state)"}
actions["stop"] = {["disabled"] = state == "Stopped", ["iconClass"] = "fa fa-fw fa-stop", ["displayName"] = "Stop (spec.state)"}
return actions
