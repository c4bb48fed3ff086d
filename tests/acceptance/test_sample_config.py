"""The sample ``tether.toml`` at the repository root stays complete and correct.

It must list every key the configuration loader knows, each set to its default (keys
without a default are commented out as ``# key = value``), so that loading it changes
nothing, and so that uncommenting any of its example lines yields a valid setting.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import msgspec

from tether.server.config import (
    SeedConsumer,
    SeedResource,
    ServerConfig,
    WebhookSeed,
    load_config,
)
from tether.testing import run_server

SAMPLE = Path(__file__).resolve().parents[2] / "tether.toml"

# A commented-out setting or table header: "# key = value", "# [[table]]".
_COMMENTED = re.compile(r"^# (\w+ = .*|\[\[?[\w.]+\]\]?)$")


def fields(struct: type[msgspec.Struct]) -> set[str]:
    return set(struct.__struct_fields__)


def uncommented() -> dict[str, Any]:
    """The sample with every commented-out setting and table switched on."""
    lines = SAMPLE.read_text().splitlines()
    text = "\n".join(m.group(1) if (m := _COMMENTED.match(line)) else line for line in lines)
    return tomllib.loads(text)


def test_loading_the_sample_gives_the_defaults() -> None:
    assert load_config(SAMPLE, {}) == ServerConfig()


def test_the_sample_names_every_key_the_loader_knows() -> None:
    doc = uncommented()
    assert set(doc) == fields(ServerConfig), "keys missing from (or unknown to) tether.toml"
    seed = doc["webhook_seed"]
    assert set(seed) == fields(WebhookSeed)
    for resource in seed["producers"] + seed["channels"]:
        assert set(resource) == fields(SeedResource)
    for consumer in seed["consumers"]:
        assert set(consumer) == fields(SeedConsumer)


def test_every_commented_out_example_is_a_valid_setting() -> None:
    # msgspec.convert checks names and types without opening the files the settings
    # name (load_config would read webhook_broker_config's INI file).
    config = msgspec.convert(uncommented(), ServerConfig)
    assert config.auth_token and config.user and config.password
    assert config.webhook_seed.consumers[0].type == "pull"


def test_a_server_starts_with_the_sample() -> None:
    # Ports and store are overridden by flags, as the sample's defaults may be in use.
    with run_server(store="memory", args=["--config", str(SAMPLE)]) as server:
        assert server.port and server.http_port
