"""``chorus.server.config``: defaults, the file < env < flags precedence, parsing of env values,
the checks of every field, config files, and the start-up description."""
from __future__ import annotations

import json

import pytest

from chorus.server.config import (DegradationConfig, ServerConfig, build_config, describe, field_names,
                                  read_config_file)


def _build(file_values=None, env=None, flags=None) -> ServerConfig:
    """build_config with an empty environment unless one is given (the test's own CHORUS_*
    variables must not leak in)."""
    return build_config(file_values, env=env or {}, flags=flags)


def _error(match: str, **sources) -> str:
    with pytest.raises(ValueError, match=match) as info:
        _build(**sources)
    return str(info.value)


def test_the_defaults_are_a_valid_config():
    config = _build()
    assert config == ServerConfig()
    assert config.variant == "turbo" and config.model_id == "chatterbox-turbo"
    assert config.port == 8000 and config.api_keys == () and config.degradation == DegradationConfig()


def test_field_names_are_the_server_fields_without_degradation():
    names = field_names()
    assert "degradation" not in names and {"port", "api_keys", "max_queue", "log_format"} <= set(names)


def test_env_wins_over_the_file_and_flags_win_over_env():
    file_values = {"port": 1111, "max_queue": 5, "host": "0.0.0.0"}
    env = {"CHORUS_PORT": "2222", "CHORUS_MAX_QUEUE": "6"}
    assert _build(file_values).port == 1111
    from_env = _build(file_values, env)
    assert (from_env.port, from_env.max_queue, from_env.host) == (2222, 6, "0.0.0.0")
    from_flags = _build(file_values, env, {"port": "3333"})
    assert (from_flags.port, from_flags.max_queue, from_flags.host) == (3333, 6, "0.0.0.0")


def test_a_flag_left_unset_does_not_override():
    assert _build({"port": 1111}, {"CHORUS_PORT": "2222"}, {"port": None}).port == 2222


def test_env_vars_without_the_prefix_or_unknown_are_ignored():
    config = _build(env={"PORT": "1", "CHORUS_NO_SUCH_SETTING": "x", "CHORUS_PORT": "9000"})
    assert config.port == 9000


def test_an_unknown_key_in_the_file_is_an_error_naming_it():
    message = _error("unknown setting", file_values={"prot": 9000})
    assert "'prot'" in message and "port" in message  # the known names are listed


def test_an_unknown_degradation_key_in_the_file_is_an_error_naming_it():
    assert "'hold'" in _error("unknown degradation setting", file_values={"degradation": {"hold": 1}})


def test_api_keys_from_env_are_a_comma_separated_tuple():
    config = _build(env={"CHORUS_API_KEYS": "first-key-1, second-key-2,,"})
    assert config.api_keys == ("first-key-1", "second-key-2")


def test_cors_origins_from_env_are_a_comma_separated_tuple():
    config = _build(env={"CHORUS_CORS_ORIGINS": "https://a.example,https://b.example"})
    assert config.cors_origins == ("https://a.example", "https://b.example")


def test_degradation_thresholds_from_env():
    config = _build(env={"CHORUS_DEGRADATION_THRESHOLDS": "0.5,0.6,0.7", "CHORUS_DEGRADATION_HOLD_S": "0.5"})
    assert config.degradation.thresholds == (0.5, 0.6, 0.7) and config.degradation.hold_s == 0.5


@pytest.mark.parametrize("value", ["0.5,0.6", "0.7,0.6,0.5", "a,b,c", ""])
def test_bad_degradation_thresholds_are_errors_naming_them(value):
    _error("degradation thresholds", env={"CHORUS_DEGRADATION_THRESHOLDS": value})


@pytest.mark.parametrize("text, value", [("true", True), ("false", False), ("1", True), ("0", False),
                                         ("yes", True), ("no", False), ("on", True), ("OFF", False),
                                         (" True ", True)])
def test_bool_values_from_env(text, value):
    assert _build(env={"CHORUS_WARMUP": text}).warmup is value


def test_a_bad_bool_is_an_error_naming_the_field():
    assert "'maybe'" in _error("warmup must be true or false", env={"CHORUS_WARMUP": "maybe"})


def test_bool_flags_override_env():
    assert _build(env={"CHORUS_CUDA_GRAPHS": "true"}, flags={"cuda_graphs": False}).cuda_graphs is False


def test_a_non_number_is_an_error_naming_the_field():
    _error("max_queue must be an integer", env={"CHORUS_MAX_QUEUE": "abc"})
    _error("memory_pressure must be a number", env={"CHORUS_MEMORY_PRESSURE": "high"})


@pytest.mark.parametrize("key, value", [("max_queue", True), ("port", 8000.5), ("memory_pressure", True),
                                        ("warmup", 1), ("warmup", "perhaps")])
def test_a_file_value_of_the_wrong_type_is_not_coerced(key, value):
    _error(key, file_values={key: value})


@pytest.mark.parametrize("sources, field", [
    ({"flags": {"port": "0"}}, "port"),
    ({"flags": {"replicas": "0"}}, "replicas"),
    ({"env": {"CHORUS_REPLICAS": "two"}}, "replicas"),
    ({"flags": {"port": "65536"}}, "port"),
    ({"env": {"CHORUS_MAX_QUEUE": "0"}}, "max_queue"),
    ({"env": {"CHORUS_MAX_INPUT_CHARS": "-1"}}, "max_input_chars"),
    ({"env": {"CHORUS_MAX_NEW_TOKENS": "0"}}, "max_new_tokens"),
    ({"env": {"CHORUS_KV_CACHE_BYTES": "-5"}}, "kv_cache_bytes"),
    ({"env": {"CHORUS_DEFAULT_DEADLINE_S": "400", "CHORUS_MAX_DEADLINE_S": "300"}}, "default_deadline_s"),
    ({"env": {"CHORUS_CANARY_INTERVAL_S": "0"}}, "canary_interval_s"),
    ({"env": {"CHORUS_START_DEADLINE_S": "-1"}}, "start_deadline_s"),
    ({"flags": {"write_stall_s": "0"}}, "write_stall_s"),
    ({"flags": {"shutdown_grace_s": "0"}}, "shutdown_grace_s"),
    ({"flags": {"admission": "lottery"}}, "admission"),
    ({"flags": {"retry_after_s": "90"}}, "retry_after_s"),
    ({"env": {"CHORUS_MEMORY_PRESSURE": "1.5"}}, "memory_pressure"),
    ({"env": {"CHORUS_GPU_MEMORY_UTILIZATION": "0"}}, "gpu_memory_utilization"),
    ({"flags": {"log_format": "xml"}}, "log_format"),
    ({"flags": {"log_level": "loud"}}, "log_level"),
    ({"env": {"CHORUS_API_KEYS": "long-enough-key,short"}}, "api_keys"),
    ({"flags": {"variant": "bogus"}}, "variant"),
    ({"file_values": {"degradation": {"hysteresis": 0.9}}}, "hysteresis"),
    ({"file_values": {"degradation": {"level3_queue_fraction": 0}}}, "level3_queue_fraction"),
    ({"flags": {"ws_max_turns": "0"}}, "ws_max_turns"),
    ({"env": {"CHORUS_WS_IDLE_TIMEOUT_S": "0"}}, "ws_idle_timeout_s"),
    ({"flags": {"ws_chunk_min_chars": "0"}}, "ws_chunk_min_chars"),
    ({"flags": {"ws_chunk_min_chars": "200", "ws_chunk_max_chars": "100"}}, "ws_chunk_min_chars"),
    ({"env": {"CHORUS_WS_CHUNK_MAX_WAIT_MS": "-1"}}, "ws_chunk_max_wait_ms"),
    ({"flags": {"http_parser": "picohttp"}}, "http_parser"),
    ({"env": {"CHORUS_SWITCH_INTERVAL_MS": "0"}}, "switch_interval_ms"),
])
def test_an_invalid_value_is_an_error_naming_the_field(sources, field):
    with pytest.raises(ValueError) as info:
        _build(**sources)
    assert field in str(info.value)


def test_a_toml_file_with_a_degradation_table(tmp_path):
    path = tmp_path / "chorus.toml"
    path.write_text('port = 9001\napi_keys = ["toml-key-0001"]\nwarmup = false\nmax_deadline_s = 60\n\n'
                    '[degradation]\nthresholds = [0.5, 0.6, 0.7]\nenabled = false\n')
    config = _build(read_config_file(path))
    assert (config.port, config.api_keys, config.warmup, config.max_deadline_s) == (9001, ("toml-key-0001",),
                                                                                     False, 60.0)
    assert config.degradation.thresholds == (0.5, 0.6, 0.7) and config.degradation.enabled is False


def test_a_json_file_with_a_degradation_table(tmp_path):
    path = tmp_path / "chorus.json"
    path.write_text(json.dumps({"max_queue": 7, "cors_origins": ["https://a.example"], "log_format": "text",
                                "degradation": {"hold_s": 0.25, "reduced_flow_steps": 3}}))
    config = _build(read_config_file(path))
    assert (config.max_queue, config.cors_origins, config.log_format) == (7, ("https://a.example",), "text")
    assert config.degradation.hold_s == 0.25 and config.degradation.reduced_flow_steps == 3


def test_a_file_setting_is_overridden_by_env(tmp_path):
    path = tmp_path / "chorus.toml"
    path.write_text("port = 9001\n")
    assert _build(read_config_file(path), {"CHORUS_PORT": "9002"}).port == 9002


def test_a_missing_file_or_an_unknown_format_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        read_config_file(tmp_path / "absent.toml")
    (tmp_path / "chorus.yaml").write_text("port: 1\n")
    with pytest.raises(ValueError, match=r"\.toml or \.json"):
        read_config_file(tmp_path / "chorus.yaml")


def test_describe_hides_api_keys():
    config = _build(env={"CHORUS_API_KEYS": "secret-key-0001,secret-key-0002"})
    description = describe(config)
    assert description["api_keys"] == "2 key(s)"
    assert "secret-key" not in json.dumps(description)
    assert description["port"] == 8000 and description["degradation"]["enabled"] is True


@pytest.mark.parametrize("given, kept", [("2", "2"), (" AUTO ", "auto"), (3, "3")])
def test_replicas_is_a_count_or_auto(given, kept):
    assert _build(file_values={"replicas": given}).replicas == kept


def test_voices_url_is_unset_by_default_and_comes_from_env():
    assert _build().voices_url is None
    assert _build(env={"CHORUS_VOICES_URL": "memory://voices"}).voices_url == "memory://voices"
    assert _build(env={"CHORUS_VOICES_URL": " "}).voices_url is None


@pytest.mark.parametrize("url, message", [
    ("/shared/voices", "must be a URL such as s3://bucket/prefix"),
    ("nope://bucket/voices", "fsspec knows no 'nope' protocol"),
])
def test_a_bad_voices_url_fails_at_start_up(url, message):
    _error(message, flags={"voices_url": url})


def test_a_voices_url_whose_package_is_missing_names_the_package():
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    _error("needs the gcsfs package: pip install gcsfs", env={"CHORUS_VOICES_URL": "gs://bucket/voices"})


def test_describe_hides_credentials_in_the_voices_url():
    description = describe(_build(flags={"voices_url": "memory://user:secret-word@host/voices"}))
    assert description["voices_url"] == "memory://***@host/voices"


def test_kv_cache_dtype_is_a_server_option_checked_at_start_up():
    from chorus.server.config import ServerConfig

    assert ServerConfig().kv_cache_dtype == "auto"
    assert ServerConfig(kv_cache_dtype="fp8_e4m3").kv_cache_dtype == "fp8_e4m3"
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8_e4m3"):
        ServerConfig(kv_cache_dtype="int8")


def test_language_step_settings_come_from_env_and_reach_the_text_front_end(tmp_path):
    from chorus.server.main import language_step_config

    config = _build(env={"CHORUS_LANGUAGE_STEPS": "Strict", "CHORUS_DICTA_MODEL": str(tmp_path / "d.onnx"),
                         "CHORUS_PKUSEG_MODEL": str(tmp_path / "pku")})
    steps = language_step_config(config)
    assert (steps.strict, steps.dicta_model, steps.pkuseg_model) == (True, tmp_path / "d.onnx", tmp_path / "pku")


def test_language_steps_default_to_lenient():
    assert ServerConfig().language_steps == "lenient"


def test_an_unknown_language_steps_mode_is_refused():
    _error("language_steps must be 'lenient' or 'strict'", env={"CHORUS_LANGUAGE_STEPS": "loose"})


def test_the_start_deadline_depends_on_the_device_unless_set():
    config = _build()
    assert config.start_deadline_s is None and config.default_deadline_s is None  # no total deadline
    assert config.start_deadline_for("cuda") == 10.0 and config.start_deadline_for("cpu") == 60.0
    assert _build(flags={"start_deadline_s": "4"}).start_deadline_for("cuda") == 4.0


def test_the_realtime_headroom_is_off_on_the_cpu_unless_set():
    config = _build()
    assert config.realtime_headroom_for("cuda") == 1.25 and config.realtime_headroom_for("cpu") == 0.0
    assert _build(flags={"realtime_headroom": "1.5"}).realtime_headroom_for("cpu") == 1.5
    _error("realtime_headroom must be a number >= 0", flags={"realtime_headroom": "-1"})


def test_an_optional_number_can_be_unset_with_none():
    config = _build(file_values={"default_deadline_s": 20.0}, env={"CHORUS_DEFAULT_DEADLINE_S": "none"})
    assert config.default_deadline_s is None


def test_the_websocket_pieces_are_bounded_by_max_input_chars_instead_of_refusing_to_start():
    chunking = _build(flags={"max_input_chars": "100"}).ws_chunking()
    assert chunking.max_chars == 100 and chunking.min_chars == 20  # a piece must pass the input check
    assert _build(flags={"max_input_chars": "10"}).ws_chunking().min_chars == 10


def test_cuda_graphs_off_turns_off_the_vocoders_graphs_too():
    from chorus.server.main import vocoder_config

    assert vocoder_config(_build()).cuda_graphs is True
    assert vocoder_config(_build(flags={"cuda_graphs": "false"})).cuda_graphs is False


def test_a_models_vocoder_batch_limit_reaches_its_vocoder_stage():
    from chorus.server.main import vocoder_config

    config = _build(flags={"models": "id=a,variant=turbo,vocoder_max_batch_items=8"})
    assert vocoder_config(config.for_entry(config.entries()[0])).max_batch_items == 8


def test_the_vocoder_pass_time_limit_reaches_the_vocoder_stage():
    from chorus.server.main import vocoder_config

    assert vocoder_config(_build()).max_pass_seconds is None
    assert vocoder_config(_build(flags={"vocoder_max_pass_seconds": "0.1"})).max_pass_seconds == 0.1


def test_the_first_window_prompt_cap_reaches_the_vocoder_stage():
    from chorus.server.main import vocoder_config

    assert vocoder_config(_build()).first_window_prompt_tokens is None
    assert vocoder_config(_build(flags={"vocoder_first_window_prompt_tokens": "50"})).first_window_prompt_tokens == 50


def test_admitting_ahead_reaches_the_t3_scheduler():
    from chorus.server.main import engine_config

    assert engine_config(_build(), 0.85).scheduler.admit_ahead is True
    assert engine_config(_build(flags={"t3_admit_ahead": "false"}), 0.85).scheduler.admit_ahead is False


def test_mixed_step_graphs_reach_the_t3_engine():
    from chorus.server.main import engine_config

    assert engine_config(_build(), 0.85).mixed_graph_tokens == 256
    assert engine_config(_build(flags={"t3_mixed_graph_tokens": "0"}), 0.85).mixed_graph_tokens == 0
    _error(r"t3_mixed_graph_tokens must be 0 \(off\) or an integer >= 64, got -1", flags={"t3_mixed_graph_tokens": "-1"})
    _error(r"t3_mixed_graph_tokens must be 0 \(off\) or an integer >= 64, got 32", flags={"t3_mixed_graph_tokens": "32"})


def test_admitting_within_the_mixed_graphs_reaches_the_t3_engine():
    from chorus.server.main import engine_config

    assert engine_config(_build(), 0.85).admit_within_graphs is True
    assert engine_config(_build(flags={"t3_admit_within_graphs": "false"}), 0.85).admit_within_graphs is False


def test_the_first_window_reaches_the_vocoder_stage():
    from chorus.server.main import vocoder_config

    assert vocoder_config(_build()).first_window_tokens == 20
    assert vocoder_config(_build(flags={"vocoder_first_window_tokens": "10"})).first_window_tokens == 10


@pytest.mark.parametrize("value", ["0", "101"])
def test_a_first_window_outside_the_vocoders_windows_is_refused_by_name(value):
    with pytest.raises(ValueError, match="vocoder_first_window_tokens must be"):
        _build(flags={"vocoder_first_window_tokens": value})


def test_the_followers_first_window_reaches_the_vocoder_stage():
    from chorus.server.main import vocoder_config

    assert vocoder_config(_build()).follower_first_window_tokens == 100
    flags = {"vocoder_follower_first_window_tokens": "60"}
    assert vocoder_config(_build(flags=flags)).follower_first_window_tokens == 60
    flags = {"vocoder_follower_first_window_tokens": "none"}  # every stream's first window, 20
    assert vocoder_config(_build(flags=flags)).follower_first_window_tokens is None


def test_the_graph_cover_work_reaches_the_vocoder_stage_and_none_turns_it_off():
    from chorus.server.main import vocoder_config

    assert vocoder_config(_build()).graph_cover_work == 4.0
    assert vocoder_config(_build(flags={"vocoder_graph_cover_work": "2"})).graph_cover_work == 2.0
    assert vocoder_config(_build(flags={"vocoder_graph_cover_work": "none"})).graph_cover_work is None


def test_the_encoder_attention_kernel_is_opt_in_and_reaches_the_vocoder_stage():
    from chorus.server.main import vocoder_config

    assert vocoder_config(_build()).encoder_attention_ops == "torch"
    flags = {"vocoder_encoder_attention_ops": "triton"}
    assert vocoder_config(_build(flags=flags)).encoder_attention_ops == "triton"
    with pytest.raises(ValueError, match="vocoder_encoder_attention_ops must be one of auto, triton, torch, got 'fla"):
        _build(flags={"vocoder_encoder_attention_ops": "flash"})


def test_the_graph_cover_work_must_be_at_least_1():
    with pytest.raises(ValueError, match="vocoder_graph_cover_work must be a number >= 1 or unset, got 0.5"):
        _build(flags={"vocoder_graph_cover_work": "0.5"})


def test_the_first_window_prompt_cap_must_be_a_positive_integer():
    with pytest.raises(ValueError, match="vocoder_first_window_prompt_tokens must be a positive integer or unset, got 0"):
        _build(flags={"vocoder_first_window_prompt_tokens": "0"})


def test_the_vocoder_pass_time_limit_must_be_positive():
    with pytest.raises(ValueError, match="vocoder_max_pass_seconds must be a positive number or unset, got 0"):
        _build(flags={"vocoder_max_pass_seconds": "0"})


def test_t3_weights_reaches_the_one_model_entry_and_back():
    config = ServerConfig(variant="multilingual", checkpoint="ckpt/mtl", t3_weights="t3_pt-BR.safetensors")
    (entry,) = config.entries()
    assert entry.t3_weights == "t3_pt-BR.safetensors"
    assert config.for_entry(entry).t3_weights == "t3_pt-BR.safetensors"


def test_a_models_entry_names_its_own_t3_weights():
    from chorus.server.model_entries import parse_entry

    entry = parse_entry({"id": "pt", "variant": "multilingual", "checkpoint": "ckpt/mtl",
                         "t3_weights": "t3_pt-BR.safetensors"})
    assert ServerConfig(models=(entry,)).for_entry(entry).t3_weights == "t3_pt-BR.safetensors"
