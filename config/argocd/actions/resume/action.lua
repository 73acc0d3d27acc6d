-- resume: spec.state becomes Running; every other field stays as it is.
if obj.spec == nil then
  obj.spec = {}
end
obj.spec.state = "Running"
return obj
