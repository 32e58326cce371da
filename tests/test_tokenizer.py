"""The locally built tokenizer in server/tokenizer (see datasets/tokenizer/)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

transformers = pytest.importorskip("transformers")

TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "server" / "tokenizer"

SPECIAL_IDS = {
    "<|begin_of_text|>": 0,
    "<|end_of_text|>": 1,
    "<|start_header_id|>": 2,
    "<|end_header_id|>": 3,
    "<|eot_id|>": 4,
    "<tool_call>": 5,
    "</tool_call>": 6,
    "<|pad|>": 7,
}

PROSE = """\
The harbour town woke slowly that morning. Fishing boats had come in before \
dawn, and the smell of salt and diesel hung over the quay while gulls argued \
about the scraps left behind by the night crews. Shopkeepers rolled up their \
shutters one after another, and the baker on the corner put out a chalkboard \
announcing that the first loaves of rye were still warm.

Maria had promised herself she would finish the report before lunch, but the \
numbers refused to agree with each other. The survey showed that most families \
in the district travelled less than five kilometres to work, yet the bus \
company claimed its longest routes were the busiest. Either the questionnaire \
had been misunderstood, or the company was counting passengers twice whenever \
they changed lines at the central station.

She decided to call the transport office directly. A patient clerk explained \
that every ticket was recorded when it was validated, so a single journey with \
one transfer appeared as two trips in the monthly summary. That settled the \
question, and it also suggested a better way to present the data: count people \
rather than tickets, and show the transfers as a separate column so that \
readers could compare the two figures themselves.

By the afternoon the wind had turned, and a light rain drifted across the \
water. Maria sent the corrected tables to her editor, closed the laptop, and \
walked down to the harbour to watch the ferry leave for the islands. Somewhere \
behind her a radio was playing an old song about leaving home, and for a \
moment the whole town seemed to be listening.
"""

CODE = '''\
from dataclasses import dataclass, field


@dataclass
class Inventory:
    """Keep track of items in a small warehouse."""

    capacity: int
    items: dict[str, int] = field(default_factory=dict)

    def total(self) -> int:
        return sum(self.items.values())

    def add(self, name: str, count: int = 1) -> None:
        if count <= 0:
            raise ValueError(f"count must be positive, got {count}")
        if self.total() + count > self.capacity:
            raise OverflowError("not enough room for %d more %s" % (count, name))
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name: str, count: int = 1) -> int:
        """Take up to ``count`` units of ``name`` and return how many were taken."""
        available = self.items.get(name, 0)
        taken = min(available, count)
        if taken == available:
            self.items.pop(name, None)
        else:
            self.items[name] = available - taken
        return taken


def busiest(inventories: list[Inventory], top: int = 3) -> list[tuple[int, Inventory]]:
    ranked = sorted(
        ((inv.total(), inv) for inv in inventories),
        key=lambda pair: pair[0],
        reverse=True,
    )
    return ranked[:top]


if __name__ == "__main__":
    store = Inventory(capacity=100)
    for product, amount in [("bolts", 40), ("nuts", 35), ("washers", 10)]:
        store.add(product, amount)
    print(store.remove("nuts", 50), store.total())
'''

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "What is the weather in Oslo?"}],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_abc123",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_abc123",
        "content": '{"temperature": 4, "sky": "rain"}',
    },
]


@pytest.fixture(scope="module")
def tok():
    return transformers.AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def chars_per_token(tok, text: str) -> float:
    return len(text) / len(tok.encode(text, add_special_tokens=False))


def test_loads_as_fast_tokenizer(tok):
    assert tok.is_fast
    assert tok.model_max_length == 131072
    assert tok.bos_token == "<|begin_of_text|>"
    assert tok.eos_token == "<|eot_id|>"
    assert tok.pad_token == "<|pad|>"


def test_special_token_ids(tok):
    for token, idx in SPECIAL_IDS.items():
        assert tok.convert_tokens_to_ids(token) == idx
        assert tok.convert_ids_to_tokens(idx) == token
    assert tok.bos_token_id == 0
    assert tok.eos_token_id == 4
    assert tok.pad_token_id == 7
    # Tool-call tags are single tokens and survive skip_special_tokens.
    ids = tok.encode(
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        add_special_tokens=False,
    )
    assert ids[0] == 5 and ids[-1] == 6
    assert tok.decode(ids, skip_special_tokens=True).startswith("<tool_call>")
    assert tok.decode(ids, skip_special_tokens=True).endswith("</tool_call>")
    # Header tokens are special (skipped).
    assert tok.decode([2, 3, 4], skip_special_tokens=True) == ""


def test_bos_added_by_default(tok):
    ids = tok.encode("hello world")
    assert ids[0] == 0
    assert 0 not in tok.encode("hello world", add_special_tokens=False)


@pytest.mark.parametrize("name,text", [("prose", PROSE), ("code", CODE)])
def test_chars_per_token(tok, name, text):
    cpt = chars_per_token(tok, text)
    assert 3.5 <= cpt <= 4.5, f"{name}: {cpt:.3f} chars/token"


@pytest.mark.parametrize(
    "text",
    [
        PROSE,
        CODE,
        "  leading spaces, trailing tabs\t\t\n\n\r\nCRLF and unicode: naïve café — 東京 🚀 \x00",
        "",
    ],
)
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


def test_random_ids_decode(tok):
    rng = random.Random(1234)
    vocab_size = len(tok)
    assert vocab_size == tok.backend_tokenizer.get_vocab_size()
    for _ in range(200):
        ids = [rng.randrange(8, vocab_size) for _ in range(rng.randrange(1, 64))]
        text = tok.decode(ids)
        assert isinstance(text, str)
        tok.decode(ids, skip_special_tokens=True)
    # every id individually, too
    for i in range(vocab_size):
        assert isinstance(tok.decode([i]), str)
    assert tok.convert_ids_to_tokens(vocab_size - 1) is not None


def test_chat_template_tools_conversation(tok):
    text = tok.apply_chat_template(
        CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert "You are a helpful assistant." in text
    assert "<tools>" in text and '"name": "get_weather"' in text
    assert (
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is the weather in Oslo?<|eot_id|>" in text
    )
    assert (
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call><|eot_id|>'
    ) in text
    assert "<|start_header_id|>tool<|end_header_id|>\n\n" in text
    assert "call_abc123" in text
    assert '{"temperature": 4, "sky": "rain"}<|eot_id|>' in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    # the tool call inside the rendered prompt parses as Hermes JSON
    body = text.split("<|start_header_id|>assistant<|end_header_id|>\n\n<tool_call>")[1]
    call = json.loads(body.split("</tool_call>")[0])
    assert call == {"name": "get_weather", "arguments": {"city": "Oslo"}}

    ids = tok.apply_chat_template(
        CONVERSATION,
        tools=TOOLS,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert ids[0] == 0 and ids.count(0) == 1
    header = tok.encode(
        "<|start_header_id|>assistant<|end_header_id|>\n\n", add_special_tokens=False
    )
    assert header[0] == 2 and ids[-len(header) :] == header
    assert 5 in ids and 6 in ids


def test_chat_template_plain(tok):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": "Tell me a joke."},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert text == (
        "<|begin_of_text|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
    )


def test_chat_template_string_arguments(tok):
    # OpenAI clients send arguments as a JSON string; it is rendered verbatim.
    messages = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "a", "arguments": '{"k": 1}'},
                },
                {"type": "function", "function": {"name": "b", "arguments": {}}},
            ],
        },
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert (
        'Let me check.\n<tool_call>{"name": "a", "arguments": {"k": 1}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call><|eot_id|>'
    ) in text


@pytest.mark.engine
def test_vllm_loads_and_renders(monkeypatch):
    """vLLM's own tokenizer loading, chat rendering and hermes tool parser."""
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    pytest.importorskip("vllm")
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template
    from vllm.tokenizers import get_tokenizer
    from vllm.tool_parsers import ToolParserManager

    tok = get_tokenizer(str(TOKENIZER_DIR))
    assert tok.eos_token_id == 4 and tok.bos_token_id == 0

    model_dir = TOKENIZER_DIR.parent / "models" / "llama-3.1-8b"
    if not (model_dir / "config.json").exists():
        pytest.skip("no emulated model config to build a vLLM ModelConfig from")
    mc = ModelConfig(model=str(model_dir), tokenizer=str(TOKENIZER_DIR))
    fmt = resolve_chat_template_content_format(None, TOOLS, "auto", tok, model_config=mc)
    # OpenAI clients send tool-call arguments as a JSON string.
    messages = json.loads(json.dumps(CONVERSATION))
    messages[2]["tool_calls"][0]["function"]["arguments"] = '{"city": "Oslo"}'
    conv, _, _ = parse_chat_messages(messages, mc, fmt)
    text = safe_apply_chat_template(
        mc, tok, conv, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>' in text
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")

    # What an emulated model would emit, decoded the way vLLM does for tool requests.
    out = tok.encode(
        'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
        add_special_tokens=False,
    )
    parser = ToolParserManager.get_tool_parser("hermes")(tok)
    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "x"}], tools=TOOLS
    )
    request = parser.adjust_request(request)
    decoded = tok.decode(out, skip_special_tokens=request.skip_special_tokens)
    info = parser.extract_tool_calls(decoded, request)
    assert info.tools_called
    assert info.content == "Checking."
    assert info.tool_calls[0].function.name == "get_weather"
    assert json.loads(info.tool_calls[0].function.arguments) == {"city": "Oslo"}
