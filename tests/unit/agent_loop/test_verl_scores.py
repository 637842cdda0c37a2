"""verl's rule scores as pure functions: each expected value is derived by hand from verl's scoring rules."""

from __future__ import annotations

import pytest

from agentrl.agent_loop.verl_scores import (
    gsm8k_extract,
    gsm8k_score,
    is_equiv,
    last_boxed_answer,
    math_dapo_score,
    math_score,
    normalize_answer,
    normalize_final_answer,
    search_r1_score,
    strip_string,
    verl_scorer,
)


@pytest.mark.parametrize("solution,truth,expected", [
    ("She has 3 * 24 = 72 apples.\n#### 72", "72", 1.0),
    ("#### 1,234", "1234", 1.0),  # commas dropped
    ("#### 5 then, corrected: #### 72", "72", 1.0),  # the last "#### " counts
    ("#### -3", "-3", 1.0),
    ("#### 72", "73", 0.0),  # wrong: format_score 0
    ("The answer is 72", "72", 0.0),  # strict: no "#### "
    ("####72", "72", 0.0),  # the space is part of the format
    ("#### $72", "72", 0.0),
    ("#### 72" + "." * 300, "72", 0.0),  # only the last 300 characters are read
    ("#### 72.0", "72", 0.0),  # string equality, as verl
])
def test_gsm8k_strict(solution, truth, expected):
    assert gsm8k_score(solution, truth) == expected


def test_gsm8k_format_score_score_and_flexible_mode():
    assert gsm8k_score("#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k_score("no answer", "72", format_score=0.1) == 0.0  # nothing extracted: 0, not the format score
    assert gsm8k_score("#### 72", "72", score=2.0) == 2.0
    assert gsm8k_score("so 5 + 67 = 72.", "72", method="flexible") == 0.0  # "72." is the last number token
    assert gsm8k_score("so 5 + 67 = 72 .", "72", method="flexible") == 1.0  # a lone "." is skipped
    assert gsm8k_extract("3 . 4 .", "flexible") == "4" and gsm8k_extract("no digits", "flexible") is None
    with pytest.raises(ValueError, match="strict"):
        gsm8k_extract("#### 1", "loose")


@pytest.mark.parametrize("solution,truth,expected", [
    ("so \\boxed{\\frac{1}{2}}", "\\frac12", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
    ("\\boxed{x = 5}", "5", 1.0),  # a short "x =" prefix is dropped
    ("\\boxed{10\\text{ cm}}", "10", 1.0),  # units after "\\text{ "
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{\\sqrt2}", "\\sqrt{2}", 1.0),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
    ("\\boxed{.5}", "0.5", 1.0),
    ("the answer is \\boxed 7$ done", "7", 1.0),  # "\\boxed x" form, up to the next "$"
    ("\\boxed{5} no wait \\boxed{6}", "5", 0.0),  # the last box counts
    ("\\boxed{5", "5", 0.0),  # unbalanced
    ("\\fbox{5}", "5", 0.0),  # found, but verl's scorer cannot unwrap an fbox either
    ("5", "5", 0.0),  # no box
    ("\\boxed{\\frac}", "\\frac", 1.0),  # not normalisable: compared raw
])
def test_math(solution, truth, expected):
    assert math_score(solution, truth) == expected


def test_math_helpers():
    assert last_boxed_answer("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}" and last_boxed_answer("none") is None
    assert strip_string("\\tfrac12") == "\\frac{1}{2}" and strip_string("k = 3") == "3"
    assert strip_string("abc = 3") == "abc=3"  # a long left side stays
    assert is_equiv(None, None) and not is_equiv("1", None)


@pytest.mark.parametrize("solution,truth,score,pred", [
    ("Let me think.\nAnswer: 42", "42", 1.0, "42"),
    ("answer : 1,000 dollars", "1000", 1.0, "1000"),
    ("Answer: $\\frac{1}{2}$", "\\frac12", 1.0, "\\frac{1}{2}"),
    ("Answer: x = 3", "3", 1.0, "3"),
    ("Answer: 7\nAnswer: 8", "7", -1.0, "8"),  # the last line counts
    ("The result is 42.", "42", -1.0, "[INVALID]"),
    ("Answer: 42" + "." * 300, "42", -1.0, "[INVALID]"),  # only the last 300 characters are read
    ("", "42", -1.0, "[INVALID]"),
])
def test_math_dapo(solution, truth, score, pred):
    assert math_dapo_score(solution, truth) == {"score": score, "acc": score == 1.0, "pred": pred}


def test_normalize_final_answer():
    assert normalize_final_answer("\\text{5 apples}") == "5apples"
    assert normalize_final_answer("\\boxed{12} degrees") == "12"
    assert normalize_final_answer("y = 2,500") == "2500"


@pytest.mark.parametrize("solution,targets,expected", [
    ("<answer>The Eiffel Tower!</answer>", ["eiffel tower"], 1.0),
    ("<answer>Lyon</answer> <answer> paris </answer>", ["London", "Paris"], 1.0),
    ("<answer>Lyon</answer>", ["Paris"], 0.0),
    ("Paris", ["Paris"], 0.0),  # no tag
    ("<answer>x</answer>" * 10 + "<answer>Paris</answer>", ["Paris"], 0.25),  # 11 tags: a quarter
    ("<answer>x</answer>" * 9 + "<answer>Paris</answer>", ["Paris"], 1.0),
    ("<answer>an apple</answer>", "apple", 1.0),  # one target as a string; articles dropped
])
def test_search_r1(solution, targets, expected):
    assert search_r1_score(solution, {"target": targets}) == expected


def test_normalize_answer():
    assert normalize_answer("  The  U.S.A.,  of course ") == "usa of course"


@pytest.mark.parametrize("source,scorer", [
    ("openai/gsm8k", "gsm8k"), ("lighteval/MATH", "math"), ("DigitalLearningGmbH/MATH-lighteval", "math"),
    ("HuggingFaceH4/MATH-500", "math"), ("math_dapo", "math_dapo"), ("math", "math_dapo"),
    ("aime2024", "math_dapo"), ("aime25", "math_dapo"), ("searchR1_nq", "search_r1"),
    ("searchR1_bamboogle", "search_r1"), ("codecontests", "code"), ("taco", "code"), ("apps", "code"),
    ("codeforces", "code"), ("gsm8k", None), ("numina_olympiads", None), ("my_qa", None),
])
def test_routing_by_data_source(source, scorer):
    assert verl_scorer(source) == scorer


def test_agrees_with_verl_where_it_is_installed():
    """Side by side with verl's own functions (skipped where verl is not installed; agentrl never imports it)."""
    reward_score = pytest.importorskip("verl.utils.reward_score")
    cases = [("openai/gsm8k", "#### 1,234", "1234"), ("openai/gsm8k", "#### 7", "8"),
             ("DigitalLearningGmbH/MATH-lighteval", "\\boxed{\\dfrac{3}{4}}", "3/4"),
             ("lighteval/MATH", "\\boxed{10\\text{ cm}}", "10"), ("math_dapo", "Answer: 1,000 dollars", "1000"),
             ("aime2024", "no answer", "42"), ("searchR1_nq", "<answer>The Eiffel Tower</answer>",
                                               {"target": ["eiffel tower"]})]
    from agentrl.agent_loop.verl_scores import SCORERS

    for source, solution, truth in cases:
        ours = SCORERS[verl_scorer(source)](solution, truth)
        theirs = reward_score.default_compute_score(source, solution, truth)
        assert ours == theirs, (source, solution, truth)
