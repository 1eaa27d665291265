"""``chorus.server.model_entries`` and the ``models``/``admin_keys`` settings: the registry as
configured in a file, a flag and the environment, the rules between entries, memory shares,
aliases, and how a request key picks a version."""
from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest

from chorus.server.config import build_config, read_config_file
from chorus.server.model_entries import ModelEntry, aliases, memory_shares, parse_entries
from chorus.server.registry import ModelRegistry, Route, Version, affinity_key

TOML = '''
[[models]]
id = "chatterbox-turbo"
variant = "turbo"
checkpoint = "ckpt/turbo"
memory_share = 0.4

[[models]]
id = "chatterbox"
variant = "original"
version = "2"
max_num_seqs = 64
'''


def test_a_config_file_lists_models_as_tables(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(TOML)
    config = build_config(read_config_file(path), env={})
    turbo, original = config.entries()
    assert turbo == ModelEntry(id="chatterbox-turbo", variant="turbo", checkpoint="ckpt/turbo", memory_share=0.4)
    assert (original.id, original.variant, original.version, original.max_num_seqs) == ("chatterbox", "original", "2", 64)


def test_a_flag_lists_models_separated_by_semicolons():
    config = build_config(env={}, flags={"models": "id=a,variant=turbo,weight=90; id=a,variant=turbo,version=b,weight=10"})
    assert [(e.id, e.version, e.weight) for e in config.entries()] == [("a", "1", 90), ("a", "b", 10)]


def test_the_environment_lists_models_too():
    config = build_config(env={"CHORUS_MODELS": "id=x,variant=nano,checkpoint=ckpt/nano"})
    assert config.entries() == (ModelEntry(id="x", variant="nano", checkpoint="ckpt/nano"),)


def test_without_models_the_one_model_is_chatterbox_variant():
    config = build_config(env={}, flags={"variant": "original", "checkpoint": "ckpt/o"})
    assert config.entries() == (ModelEntry(id="chatterbox-original", variant="original", checkpoint="ckpt/o"),)
    assert config.model_id == "chatterbox-original"


def test_a_version_config_takes_the_entry_variant_checkpoint_and_limits():
    config = build_config(env={}, flags={"models": "id=a,variant=original,checkpoint=c,max_num_seqs=8,kv_cache_bytes=4096"})
    version = config.for_entry(config.entries()[0])
    assert (version.variant, version.checkpoint, version.max_num_seqs, version.kv_cache_bytes) == ("original", "c", 8, 4096)
    assert version.model_id == "a" and version.entries() == config.entries()


@pytest.mark.parametrize("raw, message", [
    ("id=a,variant=turbo;id=a,variant=turbo", "id 'a' has version '1' twice"),
    ("id=a,variant=turbo,weight=0", "every version of 'a' has weight 0"),
    ("id=a,variant=turbo;id=a,variant=original,version=2", "versions of 'a' are of different variants"),
    ("id=a,variant=turbo,memory_share=0.7;id=b,variant=turbo,memory_share=0.5", "memory shares add up to 1.2"),
    ("id=a,variant=turbo,memory_share=1;id=b,variant=turbo", "leave nothing for the entries without one"),
    ("id=a,variant=bogus", "models entry 'a'"),
    ("id=a,variant=turbo,colour=red", "unknown setting.*colour"),
    ("id=a,variant=turbo,weight=x", "weight must be a number"),
    ("variant=turbo", "has no 'id'"),
    ("id=a b,variant=turbo", "models entry id 'a b'"),
    ("id=a,variant=turbo,version=v 2", "version 'v 2'"),
    ("id=a;variant", "is not name=value"),
])
def test_a_bad_registry_fails_at_start_up_naming_the_rule(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_entries(raw)


def test_entries_take_their_own_ray_serve_scale():
    config = build_config(env={}, flags={"replicas": "2", "models": "id=a,variant=turbo,replicas=auto;"
                                         "id=b,variant=turbo,min_replicas=1,max_replicas=4;id=c,variant=turbo"})
    a, b, c = config.entries()
    assert (a.replicas, b.min_replicas, b.max_replicas, c.replicas) == ("auto", 1, 4, None)
    from_file = parse_entries([{"id": "a", "variant": "turbo", "replicas": 3}])
    assert from_file[0].replicas == "3"


@pytest.mark.parametrize("raw, message", [
    ("id=a,variant=turbo,replicas=0", "replicas must be a positive integer or 'auto'"),
    ("id=a,variant=turbo,min_replicas=0", "min_replicas must be a positive integer"),
    ("id=a,variant=turbo,min_replicas=3,max_replicas=2", r"min_replicas \(3\) must be <= max_replicas \(2\)"),
])
def test_bad_scale_settings_name_the_entry(raw, message):
    with pytest.raises(ValueError, match=f"models entry 'a': {message}"):
        parse_entries(raw)


def test_a_one_process_server_refuses_the_ray_serve_settings():
    config = build_config(env={}, flags={"models": "id=a,variant=turbo;id=b,variant=turbo,replicas=2,max_replicas=3"})
    with pytest.raises(ValueError, match="models entry 'b' version '1': replicas, max_replicas are Ray Serve settings"):
        ModelRegistry(config, lambda version_config: None)


@pytest.mark.parametrize("flags, message", [
    ({"admin_keys": "short"}, "at least 16 characters"),
    ({"admin_keys": "same-key-0123456789", "api_keys": "same-key-0123456789"}, "must not also be an API key"),
])
def test_admin_keys_are_long_and_apart_from_api_keys(flags, message):
    with pytest.raises(ValueError, match=message):
        build_config(env={}, flags=flags)


def test_entries_without_a_share_split_what_the_others_leave():
    entries = parse_entries("id=a,variant=turbo,memory_share=0.5;id=b,variant=turbo;id=c,variant=nano")
    assert memory_shares(entries) == {("a", "1"): 0.5, ("b", "1"): 0.25, ("c", "1"): 0.25}


def test_chatterbox_variant_ids_answer_to_the_variant_name_unless_it_is_taken():
    entries = parse_entries("id=chatterbox-turbo,variant=turbo;id=chatterbox-nano,variant=nano;id=nano,variant=nano")
    assert aliases(entries) == {"turbo": "chatterbox-turbo"}


def _route(*weights: int) -> Route:
    versions = tuple(Version(ModelEntry(id="m", variant="turbo", version=str(i), weight=w),
                             SimpleNamespace(state="ready")) for i, w in enumerate(weights))
    return Route("m", versions)


def test_a_key_always_picks_the_same_version():
    route = _route(50, 50)
    assert all(route.pick(f"k{i}") is route.pick(f"k{i}") for i in range(50))


def test_keys_split_by_weight():
    counts = collections.Counter(_route(90, 10).pick(f"k{i}").label for i in range(4000))
    assert 0.87 < counts["0"] / 4000 < 0.93


def test_lowering_a_weight_moves_only_the_keys_it_gave_up():
    before, after = _route(90, 10), _route(80, 20)
    moved = [k for k in (f"k{i}" for i in range(2000)) if before.pick(k).label != after.pick(k).label]
    assert all(before.pick(k).label == "0" for k in moved)  # only keys of the version that shrank move


def test_a_version_that_is_not_ready_is_passed_over():
    route = _route(50, 50)
    route.versions[0].service.state = "failed"
    assert {route.pick(f"k{i}").label for i in range(20)} == {"1"}


@pytest.mark.parametrize("headers, query_key, expected", [
    ({"x-chorus-affinity": "call-7", "authorization": "Bearer key-0123456789"}, "q", "call-7"),
    ({"authorization": "Bearer key-0123456789"}, "q", "key-0123456789"),
    ({"authorization": "Basic abc"}, "query-key-123", "query-key-123"),
    ({}, None, None),
])
def test_the_affinity_key_is_the_header_else_the_api_key(headers, query_key, expected):
    assert affinity_key(headers, query_key) == expected
