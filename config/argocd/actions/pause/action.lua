-- pause: spec.state becomes Paused; every other field stays as it is.
if obj.spec == nil then
  obj.spec = {}
end
obj.spec.state = "Paused"
return obj
