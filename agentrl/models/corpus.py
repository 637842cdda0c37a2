"""A seeded synthetic text corpus for training the tiny byte-level BPE tokenizer.

The corpus mirrors what the tiny model will see in agentrl: English-ish prose, numbers and arithmetic, JSON tool
calls and tool schemas, entity/fact sentences, python snippets and chat-formatted conversations. It is generated
in code (no downloads) and is fully determined by the seed, so the tokenizer trained on it is reproducible.

Chat text is yielded as the pieces between special tokens (`<|im_start|>` etc.), because at encode time the
tokenizer splits added tokens out before BPE runs; training on the pieces keeps the special-token spellings from
wasting merges.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator

WORDS = """
the of and to in is that it for was on are as with his they at be this from have or by one had not but what all
were when we there can an your which their said if do will each about how up out them then she many some so
these would other into has more her two like him see time could no make than first been its who now people my
made over did down only way find use may water long little very after words called just where most know get
through back much before go good new write our used me man too any day same right look think also around another
came come work three word must because does part even place well such here take why things help put years
different away again off went old number great tell men say small every found still between name should home big
give air line set own under read last never us left end along while might next sound below saw something thought
both few those always looked show large often together asked house world going want school important until form
food keep children feet land side without boy once animals life enough took sometimes four head above kind began
almost live page got earth need far hand high year mother light parts country father let night following picture
being study second eyes soon times story boys since white days ever paper hard near sentence better best across
during today others however sure means knew try told young miles sun ways thing whole hear example heard several
change answer room sea against top turned learn point city play toward five using himself usually question
answer result value total sum product difference quotient compute calculate search find tool call function
return python code error output input file data list string integer float true false none null agent model
able accept account across action activity actually add address admit adult affect afraid agree ahead allow
already although among amount analysis animal appear apply approach area argue arm army arrive article artist
assume attack attention available avoid baby bad bag ball bank bar base beat beautiful become bed behavior
believe benefit beyond bill bit black blood blue board body book born box break bring brother budget build
building business buy camera campaign cancer candidate capital car card care career carry case catch cause
cell center central century certain chair challenge chance character charge check child choice choose church
citizen civil claim class clear close coach cold collection college color commercial common community company
compare computer concern condition conference congress consider consumer contain continue control cost could
couple course court cover create crime cultural culture cup current customer cut dark daughter dead deal death
debate decade decide decision deep defense degree democrat describe design despite detail determine develop
die diet difficult dinner direction director discover discuss disease doctor dog door draw dream drive drop
drug early east easy eat economic economy edge education effect effort eight either election else employee
energy enjoy enter entire environment especially establish evening event everybody everyone evidence exactly
exist expect experience expert explain eye face fact factor fail fall family fast fear federal feel feeling
field fight figure fill film final finally financial fine finger finish fire firm fish floor fly focus follow
foot force foreign forget former forward free friend front full fund future game garden gas general
generation girl glass goal government green ground group grow growth guess gun guy hair half hang happen happy
health heart heat heavy history hit hold hope hospital hot hotel hour huge human hundred husband idea identify
image imagine impact improve include increase indeed indicate individual industry information inside instead
institution interest interesting international interview investment involve issue item itself job join
kitchen knowledge lake language late later laugh law lawyer lay lead leader learn least leave legal less
letter level lie likely listen little local lose loss lot love low machine magazine main maintain major
majority manage management manager market marriage material matter maybe measure media medical meet meeting
member memory mention message method middle military million mind minute miss mission modern moment money
month morning mouth move movement movie music myself nation national natural nature necessary network news
newspaper nice none nor north note nothing notice occur offer office officer official oil ok once onto open
operation opportunity option order organization original outside owner pain painting parent particular
partner party pass past patient pattern pay peace perform performance perhaps period person personal phone
physical pick piece plan plant player police policy political politics poor popular population position
positive possible power practice prepare present president pressure pretty prevent price private probably
problem process produce professional professor program project property protect prove provide public pull
purpose push quality quickly quite race radio raise range rate rather reach ready real reality realize reason
receive recent recently recognize record red reduce reflect region relate relationship religious remain
remember remove report represent require research resource respond response responsibility rest rich rise
risk road rock role rule run safe scene science scientist score season seat section security seek seem sell
send senior sense series serious serve service seven several sex shake share shoot short shot shoulder
similar simple simply single sister sit site situation six size skill skin social society soldier someone
son song sort source south southern space speak special specific speech spend sport spring staff stage stand
standard star start state statement station stay step stock stop store strategy street strong structure
student stuff style subject success successful suddenly suffer suggest summer support surface system table
talk task tax teach teacher team technology television ten tend term test thank theory third thousand threat
throughout thus ticket total tough town trade traditional training travel treat treatment tree trial trip
trouble truth type understand unit university unless upon valley various victim view violence visit voice
vote wait walk wall watch weapon wear week weight west western whatever whether window wish woman wonder
worker worry wrong yard yeah yes yet yourself
""".split()

CITIES = """Paris London Berlin Madrid Rome Tokyo Cairo Lima Oslo Vienna Dublin Lisbon Athens Prague Warsaw
Ottawa Canberra Nairobi Seoul Hanoi Bangkok Santiago Bogota Helsinki Stockholm Copenhagen Brussels Amsterdam
Zurich Geneva Moscow Beijing Delhi Sydney Toronto Boston Chicago Denver""".split()

COUNTRIES = """France England Germany Spain Italy Japan Egypt Peru Norway Austria Ireland Portugal Greece Czechia
Poland Canada Australia Kenya Korea Vietnam Thailand Chile Colombia Finland Sweden Denmark Belgium Netherlands
Switzerland Russia China India Brazil Mexico Argentina Nigeria Morocco Turkey Iran""".split()

RELATIONS = ["capital", "population", "founded", "color", "height", "author", "language", "currency", "country",
             "born", "leader", "area", "river", "mountain", "planet", "element", "symbol", "year", "owner", "city"]

SYLLABLES = ["ka", "lo", "mi", "ra", "ze", "tu", "vo", "ni", "sa", "qu", "el", "an", "or", "is", "ba", "de",
             "fi", "go", "hu", "ji", "ko", "lu", "ma", "ne", "po", "ri", "sy", "te", "ul", "wa", "xe", "yo"]

UNICODE_SNIPPETS = ["café", "naïve", "façade", "Zürich", "São Paulo", "München", "Ελλάδα", "Россия", "日本語",
                    "中文", "한국어", "العربية", "emoji 🙂", "π ≈ 3.14159", "x² + y² = z²", "€100", "½ cup", "→"]

SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a careful math assistant. Use the calculator tool.",
                  "You answer questions about entities using the lookup tool.",
                  "You write python code and test it with the python tool.",
                  "Think step by step and put the final answer in <answer></answer> tags."]

TOOL_SCHEMAS = [
    {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "description": "The expression, for example 12*7+3."}},
            "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "lookup", "description": "Look up the known facts about an entity.",
        "parameters": {"type": "object", "properties": {
            "entity": {"type": "string", "description": "The entity name."}}, "required": ["entity"]}}},
    {"type": "function", "function": {
        "name": "python", "description": "Run python code in a stateful sandbox and return its output.",
        "parameters": {"type": "object", "properties": {
            "code": {"type": "string", "description": "The python code to run."}}, "required": ["code"]}}},
]

TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>"
)

_SPECIAL_SPLIT = re.compile(r"<\|endoftext\|>|<\|im_start\|>|<\|im_end\|>|</?tool_call>|</?tool_response>|</?think>")


def generate_corpus(seed: int, target_chars: int = 300_000) -> Iterator[str]:
    """Yield corpus pieces (no special tokens inside) until about `target_chars` characters were produced."""
    rng = random.Random(seed)
    makers = [(_sentence, 4), (_arithmetic, 4), (_numbers, 2), (_fact, 3), (_python, 2), (_tool_call_json, 2),
              (_conversation, 4), (_unicode, 1)]
    funcs = [f for f, _ in makers]
    weights = [w for _, w in makers]
    produced = 0
    while produced < target_chars:
        text = rng.choices(funcs, weights)[0](rng)
        for piece in _SPECIAL_SPLIT.split(text):
            if piece:
                produced += len(piece)
                yield piece


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


def _entity(rng: random.Random) -> str:
    return rng.choice([rng.choice(CITIES), rng.choice(COUNTRIES), _name(rng), f"{_name(rng)} {_name(rng)}"])


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
    text = " ".join(words).capitalize() + rng.choice([".", ".", "?", "!", ","])
    return text + rng.choice([" ", "\n", "\n\n"])


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        return str(rng.randint(0, 999))
    if kind < 0.8:
        return str(rng.randint(0, 10**rng.randint(3, 9)))
    if kind < 0.9:
        return str(-rng.randint(1, 9999))
    return f"{rng.uniform(0, 1000):.{rng.randint(1, 4)}f}"


def _numbers(rng: random.Random) -> str:
    return " ".join(_number(rng) for _ in range(rng.randint(3, 12))) + "\n"


def _expression(rng: random.Random) -> str:
    terms = [str(rng.randint(0, 10 ** rng.randint(1, 3))) for _ in range(rng.randint(2, 4))]
    space = rng.random() < 0.5
    text = terms[0]
    for term in terms[1:]:
        op = rng.choice("+-*/")
        text += f" {op} {term}" if space else f"{op}{term}"
    if rng.random() < 0.3:
        text = f"({text})" + (" * " if space else "*") + str(rng.randint(2, 20))
    return text


def _arithmetic(rng: random.Random) -> str:
    expr = _expression(rng)
    try:
        value = eval(expr, {"__builtins__": {}})  # noqa: S307 - our own generated digits and operators only
    except ZeroDivisionError:
        value = "undefined"
    if isinstance(value, float):
        value = round(value, 4)
    form = rng.choice(["{e} = {v}\n", "What is {e}? The answer is {v}.\n", "<answer>{v}</answer>",
                       "Compute {e}.\n", "{e}\n"])
    return form.format(e=expr, v=value)


def _fact(rng: random.Random) -> str:
    entity = _entity(rng)
    facts = {rng.choice(RELATIONS): rng.choice([_entity(rng), _number(rng), rng.choice(WORDS)])
             for _ in range(rng.randint(1, 4))}
    form = rng.random()
    if form < 0.4:
        rel, value = next(iter(facts.items()))
        return f"The {rel} of {entity} is {value}.\n"
    if form < 0.7:
        return "\n".join(f"{entity} {rel}: {value}" for rel, value in facts.items()) + "\n"
    return json.dumps({"entity": entity, "facts": facts}) + "\n"


def _python(rng: random.Random) -> str:
    name = rng.choice(["add", "solve", "count_words", "fib", "is_prime", "mean", "total", "parse", "f", "g"])
    arg = rng.choice(["x", "n", "items", "text", "values", "a, b"])
    body = rng.choice([
        f"    return {arg.split(',')[0]} + {rng.randint(1, 99)}\n",
        "    result = 0\n    for i in range(n):\n        result += i * i\n    return result\n",
        "    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        "    words = text.split()\n    return len(words)\n",
        "    return sum(values) / len(values)\n",
        "    return [item for item in items if item is not None]\n",
    ])
    code = f"def {name}({arg}):\n{body}"
    if rng.random() < 0.5:
        code += f"\n\nprint({name}({rng.randint(0, 30)}))\n"
    if rng.random() < 0.3:
        code += f"assert {name}({rng.randint(0, 9)}) == {rng.randint(0, 99)}\n"
    return f"```python\n{code}```\n" if rng.random() < 0.5 else code


def _tool_call_json(rng: random.Random) -> str:
    name, arguments = _random_call(rng)
    return json.dumps({"name": name, "arguments": arguments}) + "\n"


def _random_call(rng: random.Random) -> tuple[str, dict]:
    kind = rng.random()
    if kind < 0.5:
        return "calculator", {"expression": _expression(rng).replace(" ", "") if rng.random() < 0.5
                              else _expression(rng)}
    if kind < 0.8:
        return "lookup", {"entity": _entity(rng)}
    return "python", {"code": _python(rng).strip("`\n").removeprefix("python\n")}


def _unicode(rng: random.Random) -> str:
    return " ".join(rng.choice(UNICODE_SNIPPETS) for _ in range(rng.randint(1, 4))) + "\n"


def _conversation(rng: random.Random) -> str:
    """A chat in the same shape the chat template renders (special tokens are split out by the caller)."""
    system = rng.choice(SYSTEM_PROMPTS)
    use_tools = rng.random() < 0.6
    if use_tools:
        tools = "".join("\n" + json.dumps(t) for t in rng.sample(TOOL_SCHEMAS, rng.randint(1, 3)))
        system += TOOLS_PREAMBLE + tools + TOOLS_POSTAMBLE
    parts = [f"<|im_start|>system\n{system}<|im_end|>\n"]
    expr = _expression(rng)
    parts.append(f"<|im_start|>user\n{rng.choice(['What is', 'Compute', 'Please calculate'])} {expr}?<|im_end|>\n")
    for _ in range(rng.randint(0, 2) if use_tools else 0):
        calls = [_random_call(rng) for _ in range(rng.randint(1, 2))]
        think = f"<think>\nI should use the {calls[0][0]} tool.\n</think>\n" if rng.random() < 0.3 else ""
        rendered = "".join(
            f"\n<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)
        parts.append(f"<|im_start|>assistant\n{think}{rendered.lstrip()}<|im_end|>\n<|im_start|>user")
        parts.extend(f"\n<tool_response>\n{_number(rng)}\n</tool_response>" for _ in calls)
        parts.append("<|im_end|>\n")
    parts.append(f"<|im_start|>assistant\nThe answer is <answer>{_number(rng)}</answer><|im_end|>\n<|endoftext|>")
    return "".join(parts)
