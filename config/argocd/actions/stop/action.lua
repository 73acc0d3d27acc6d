-- stop: spec.state becomes Stopped; every other field stays as it is.
if obj.spec == nil then
  obj.spec = {}
end
obj.spec.state = "Stopped"
return obj
