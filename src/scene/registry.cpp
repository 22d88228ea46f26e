// The scene registry: scenes register themselves when their library loads.
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "pinstage/error.h"
#include "pinstage/scene.h"

namespace pinstage {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<std::shared_ptr<const Scene>> scenes;  // sorted by name
};

// Function-local: registrars of other libraries may run before this file's statics.
// Never destroyed: threads still running at exit may look a scene up.
Registry& registry() {
  static Registry& r = *new Registry;
  return r;
}

std::string joined_names(const std::vector<std::shared_ptr<const Scene>>& scenes) {
  std::string names;
  for (const auto& s : scenes) names += (names.empty() ? "" : ", ") + s->name();
  return names.empty() ? "none" : names;
}

}  // namespace

SceneGolden::~SceneGolden() = default;
RoundReset::~RoundReset() = default;
Scene::~Scene() = default;

uint64_t Scene::save_golden(const SceneGolden&, const std::string&) const {
  throw Error(ErrorCode::unsupported, "scene " + name() + " cannot save its golden");
}

std::unique_ptr<RoundReset> Scene::round_reset(const TaskArgs&, const SceneValues&) const {
  return nullptr;
}

std::string Scene::generator() const { return {}; }

void Scene::validate_steps(const SceneValues&, int steps) const {
  if (steps != 1)
    throw Error(ErrorCode::invalid_argument, "scene " + name() +
                                                 " runs one step (its task is "
                                                 "not a loop); --steps must be 1, got " +
                                                 std::to_string(steps));
}

std::vector<std::string> Scene::advance(const TaskArgs&, const SceneValues&, int) const {
  throw Error(ErrorCode::unsupported, "scene " + name() + " has no steps to advance");
}

std::vector<std::pair<std::string, std::string>> Scene::device_feeds(const SceneValues&) const {
  return {};
}

std::vector<ByteRange> Scene::written_ranges(const TaskArgs& args, const SceneValues&) const {
  std::vector<ByteRange> ranges;
  for (const Tensor& t : args)
    if (t.direction() == Direction::inout && t.nbytes() > 0)
      ranges.push_back({t.name(), 0, t.nbytes()});
  return ranges;
}

std::string Scene::describe(const SceneValues& values) const {
  std::string text;
  for (const SceneParam& p : params()) {
    const auto it = values.find(p.name);
    if (it != values.end())
      text += (text.empty() ? "" : ", ") + p.name + " " + std::to_string(it->second);
  }
  return text;
}

std::string param_flag(std::string_view name) {
  std::string flag = "--" + std::string(name);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

TaskSizes task_sizes(const std::vector<SceneTensor>& tensors) {
  TaskSizes s;
  for (const SceneTensor& t : tensors) {
    ++s.tensors;
    s.total_bytes += t.nbytes;
    if (t.dir != Direction::out) {
      ++s.input_tensors;
      s.input_bytes += t.nbytes;
    }
  }
  return s;
}

TaskSizes task_sizes(const TaskArgs& args) {
  TaskSizes s;
  s.tensors = args.size();
  s.input_tensors = args.input_count();
  s.total_bytes = args.total_bytes();
  s.input_bytes = args.input_bytes();
  return s;
}

void register_scene(std::shared_ptr<const Scene> scene) {
  if (!scene) throw Error(ErrorCode::invalid_argument, "register_scene: no scene given");
  const std::string name = scene->name();
  if (name.empty()) throw Error(ErrorCode::invalid_argument, "register_scene: empty scene name");
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto at =
      std::lower_bound(r.scenes.begin(), r.scenes.end(), name,
                       [](const auto& s, const std::string& n) { return s->name() < n; });
  if (at != r.scenes.end() && (*at)->name() == name)
    throw Error(ErrorCode::invalid_argument,
                "register_scene: a scene named '" + name + "' is already registered");
  r.scenes.insert(at, std::move(scene));
}

std::vector<std::shared_ptr<const Scene>> registered_scenes() {
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  return r.scenes;
}

std::shared_ptr<const Scene> find_scene(std::string_view name) {
  const auto scenes = registered_scenes();
  for (const auto& s : scenes)
    if (s->name() == name) return s;
  throw Error(ErrorCode::not_found, "no scene named '" + std::string(name) +
                                        "' (registered: " + joined_names(scenes) + ")");
}

SceneValues resolve_params(const Scene& scene, const SceneValues& given) {
  const std::vector<SceneParam> params = scene.params();
  SceneValues values;
  for (const SceneParam& p : params) values[p.name] = p.default_value;
  for (const auto& [name, value] : given) {
    if (values.count(name) == 0) {
      std::string valid;
      for (const SceneParam& p : params) valid += (valid.empty() ? "" : ", ") + p.name;
      throw Error(ErrorCode::invalid_argument, "scene " + scene.name() + " has no parameter '" +
                                                   name + "' (valid: " + valid + ")");
    }
    values[name] = value;
  }
  scene.validate(values);
  return values;
}

std::optional<SceneParam> size_param(const Scene& scene) {
  for (const SceneParam& p : scene.params())
    if (p.size) return p;
  return std::nullopt;
}

}  // namespace pinstage
