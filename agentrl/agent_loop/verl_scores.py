"""verl's rule-based scores, as pure functions of (solution text, ground truth).

Each function gives what verl's `verl.utils.reward_score` gives for the same inputs, written for agentrl (verl is
not imported); `verl_scorer` routes a `data_source` the way verl's `default_compute_score` does:

    openai/gsm8k                                      gsm8k_score       "#### <number>", strict; 1 / 0
    lighteval/MATH, DigitalLearningGmbH/MATH-lighteval,
    HuggingFaceH4/MATH-500                            math_score        last \\boxed{}, is_equiv; 1 / 0
    math_dapo, math, math_dapo_reasoning, aime*       math_dapo_score   "Answer: ..."; {"score": 1 / -1, "acc", "pred"}
    searchR1_nq, searchR1_triviaqa, ...               search_r1_score   <answer> exact match; 1 (1/4 past 10 tags) / 0
    codecontests, apps, codeforces, taco              "code"            tests in the sandbox (`verl_reward`)

The glue that scores an agentrl episode with them (answer text, sandbox, custom functions) is
`agentrl.agent_loop.verl_reward`.
"""

from __future__ import annotations

import re
import string
from typing import Any, Callable

GSM8K_CLIP_CHARS = 300  # verl matches "#### " in the last 300 characters only
DAPO_CLIP_CHARS = 300  # ... and "Answer:" in the last 300
SEARCH_R1_MAX_TAGS = 10  # more <answer> or </answer> tags than this: a right answer scores a quarter

_GSM8K_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_GSM8K_FLEXIBLE = re.compile(r"(-?[0-9.,]+)")
_DAPO_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


# ---------------------------------------------------------------- GSM8K

def gsm8k_extract(solution_str: str, method: str = "strict") -> str | None:
    """The answer verl's gsm8k scorer reads from the last 300 characters: strict, the number after the last
    "#### " with commas dropped; flexible, the last number that is not a lone ".". None when there is none."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-GSM8K_CLIP_CHARS:]
    if method == "strict":
        found = _GSM8K_STRICT.findall(tail)
        return found[-1].replace(",", "") if found else None
    numbers = _GSM8K_FLEXIBLE.findall(tail)
    if not numbers:
        return None
    usable = [n for n in numbers if n != "."]
    return usable[-1] if usable else numbers[0]


def gsm8k_score(solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0,
                score: float = 1.0) -> float:
    """`score` when the extracted answer equals `ground_truth` (string equality, as verl), `format_score` when an
    answer was found but differs, 0 when none was found."""
    answer = gsm8k_extract(solution_str, method)
    if answer is None:
        return 0.0
    return float(score) if answer == ground_truth else float(format_score)


# ---------------------------------------------------------------- MATH (hendrycks normalisation)

class _Unnormalisable(ValueError):
    """`strip_string` met a string it cannot normalise; `is_equiv` then compares the raw strings (as verl)."""


def last_boxed_answer(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\boxed x`, up to the next "$") in `text`; None when there is
    none or it is unbalanced, or the last box is an `\\fbox` (which verl's scorer cannot unwrap either)."""
    if "\\boxed " in text:
        return text.split("\\boxed ")[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                boxed = text[start:i + 1]
                prefix = "\\boxed{"
                return boxed[len(prefix):-1] if boxed.startswith(prefix) else None
    return None


def _fix_fracs(s: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1{72} -> \\frac{1}{72}; a \\frac followed by one character stays as is."""
    head, *rest = s.split("\\frac")
    out = head
    for part in rest:
        out += "\\frac"
        if not part:
            raise _Unnormalisable(s)
        if part[0] == "{":
            out += part
        elif len(part) < 2:
            return s
        elif part[1] == "{":
            out += "{" + part[0] + "}" + part[1:]
        else:
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
    return out


def _fix_a_slash_b(s: str) -> str:
    """"3/4" -> \\frac{3}{4} for plain integers; anything else unchanged."""
    parts = s.split("/")
    if len(parts) != 2:
        return s
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return s
    return f"\\frac{{{a}}}{{{b}}}" if s == f"{a}/{b}" else s


def _remove_right_units(s: str) -> str:
    if "\\text{ " not in s:
        return s
    parts = s.split("\\text{ ")
    if len(parts) != 2:
        raise _Unnormalisable(s)
    return parts[0]


def _fix_sqrt(s: str) -> str:
    """\\sqrt3 -> \\sqrt{3}."""
    if "\\sqrt" not in s:
        return s
    head, *rest = s.split("\\sqrt")
    out = head
    for part in rest:
        if not part:
            raise _Unnormalisable(s)
        out += "\\sqrt" + part if part[0] == "{" else "\\sqrt{" + part[0] + "}" + part[1:]
    return out


def strip_string(s: str) -> str:
    """The MATH answer normalisation verl uses (lm-evaluation-harness's hendrycks_math): drop line breaks, \\!,
    \\left/\\right, degrees, \\$, units after "\\text{ ", percent signs and spaces; "k = " prefixes of at most two
    characters; tfrac/dfrac -> frac; fix \\sqrt3, \\frac12 and a/b; leading "." -> "0."; 0.5 -> \\frac{1}{2}.
    Raises _Unnormalisable where the original raises."""
    for old, new in (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"),
                     ("\\left", ""), ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", "")):
        s = s.replace(old, new)
    s = _remove_right_units(s)
    for old, new in (("\\\\%", ""), ("\\%", ""), (" .", " 0."), ("{.", "{0.")):
        s = s.replace(old, new)
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _fix_sqrt(s).replace(" ", "")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def is_equiv(a: str | None, b: str | None) -> bool:
    """Equal after `strip_string`; compared raw when either cannot be normalised (or is not a string)."""
    if a is None or b is None:
        return a is None and b is None
    try:
        return strip_string(a) == strip_string(b)
    except (_Unnormalisable, AttributeError, TypeError):
        return a == b


def math_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the last \\boxed{} answer `is_equiv` to `ground_truth`, else 0.0 (verl's math_reward)."""
    answer = last_boxed_answer(solution_str)
    return float(answer is not None and is_equiv(answer, ground_truth))


# ---------------------------------------------------------------- DAPO math (Minerva normalisation)

_DAPO_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                       (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
# units and words removed from a final answer, in this order
_DAPO_REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                 "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                 "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                 "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
                 ",\\!", "{,}", '"', "\\dots")


def normalize_final_answer(answer: str) -> str:
    """Minerva's final-answer normalisation (verl's math_dapo): keep what follows the last "=", drop articles,
    spaces, units and \\text/\\textbf/\\overline/\\boxed wrappers, keep the first $...$, expand \\fracab and
    \\sqrta, drop "$", and the commas of a plain integer."""
    answer = answer.split("=")[-1]
    for old, new in _DAPO_SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for word in _DAPO_REMOVED:
        answer = answer.replace(word, "")
    answer = re.sub(r"(.*?)\$(.*?)\$(.*)", r"$\2$", answer)
    for wrapper in ("text", "textbf", "overline"):
        answer = re.sub(rf"\\{wrapper}\{{(.*?)\}}", r"\1", answer)
    answer = re.sub(r"\\boxed\{(.*)\}", r"\1", answer)
    answer = re.sub(r"frac([^{])(.)", r"frac{\1}{\2}", answer)
    answer = re.sub(r"sqrt([^{])", r"sqrt{\1}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def math_dapo_score(solution_str: str, ground_truth: str) -> dict:
    """{"score": 1.0 or -1.0, "acc": bool, "pred": str}: the last "Answer: ..." line in the last 300 characters,
    normalised, equals the normalised ground truth ("[INVALID]" is the prediction when there is no such line)."""
    found = _DAPO_ANSWER.findall(solution_str[-DAPO_CLIP_CHARS:])
    pred = normalize_final_answer(found[-1] if found else "[INVALID]")
    correct = pred == normalize_final_answer(ground_truth)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


# ---------------------------------------------------------------- search-R1 QA

def normalize_answer(s: str) -> str:
    """SQuAD-style answer normalisation: lower case, no punctuation, no articles (a, an, the), single spaces."""
    s = "".join(ch for ch in s.lower() if ch not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


def search_r1_score(solution_str: str, ground_truth: dict, format_score: float = 0.0, score: float = 1.0) -> float:
    """`score` when the last <answer>...</answer> matches one of `ground_truth["target"]` after `normalize_answer`
    (a quarter of it when the text has more than 10 opening or closing tags), `format_score` when it matches none,
    0 when there is no tag."""
    tags = _ANSWER_TAG.findall(solution_str)
    if not tags:
        return 0.0
    targets = ground_truth["target"]
    targets = [targets] if isinstance(targets, str) else list(targets)
    answer = normalize_answer(tags[-1].strip())
    if not any(normalize_answer(t) == answer for t in targets):
        return float(format_score)
    many = max(solution_str.count("<answer>"), solution_str.count("</answer>")) > SEARCH_R1_MAX_TAGS
    return float(score) / 4 if many else float(score)


# ---------------------------------------------------------------- routing by data_source

MATH_SOURCES = frozenset({"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"})
DAPO_SOURCES = frozenset({"math_dapo", "math", "math_dapo_reasoning"})  # and every source starting with "aime"
SEARCH_R1_SOURCES = frozenset({"searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                               "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"})
CODE_SOURCES = frozenset({"codecontests", "apps", "codeforces", "taco"})
# sources verl scores with scorers agentrl does not have (prime_math's sympy grader, geo3k's mathruler)
UNSUPPORTED_SOURCES = {**{s: "prime_math" for s in ("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime",
                                                      "numina_synthetic_amc", "numina_cn_k12", "numina_olympiads")},
                       "hiyouga/geometry3k": "geo3k"}

SCORERS: dict[str, Callable[[str, Any], float | dict]] = {
    "gsm8k": gsm8k_score, "math": math_score, "math_dapo": math_dapo_score, "search_r1": search_r1_score}


def verl_scorer(data_source: str) -> str | None:
    """Which scorer verl's `default_compute_score` uses for `data_source`: a `SCORERS` key, "code" (tests run in
    a sandbox), or None when verl has none that agentrl implements (see `UNSUPPORTED_SOURCES`)."""
    if data_source == "openai/gsm8k":
        return "gsm8k"
    if data_source in MATH_SOURCES:
        return "math"
    if data_source in DAPO_SOURCES or data_source.startswith("aime"):
        return "math_dapo"
    if data_source in CODE_SOURCES:
        return "code"
    if data_source in SEARCH_R1_SOURCES:
        return "search_r1"
    return None


__all__ = ["CODE_SOURCES", "DAPO_SOURCES", "MATH_SOURCES", "SCORERS", "SEARCH_R1_SOURCES", "UNSUPPORTED_SOURCES",
           "gsm8k_extract", "gsm8k_score", "is_equiv", "last_boxed_answer", "math_dapo_score", "math_score",
           "normalize_answer", "normalize_final_answer", "search_r1_score", "strip_string", "verl_scorer"]
