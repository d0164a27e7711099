r"""Grader table: (completion, reference, verdict) pairs a careful human grader decides.

One row per pair: ``(family, completion, reference, verdict, why)``. ``verdict`` is what a careful
grader of an instruct model's output says under the default reward settings: the completion is
credited only when its clearly marked final answer (``\boxed{}``, ``<answer>``, "the answer is",
"Answer:", ``####``) denotes the reference's value. Verdicts were decided by hand from the
mathematics and the conventions of the MATH / GSM8K answer keys, not read off any implementation.

Conventions decided here (also in docs/design.md, rewards section):
- Percent: ``p%`` matches a reference ``p`` or ``p\%`` (answer keys drop or keep the sign) and a
  reference ``p/100`` (the same quantity). A bare ``p`` does not match a reference ``p/100``.
- Units and currency are dropped when they follow a number; unit conversion is not done.
- ``2\frac{1}{2}`` (a digit string then a numeric fraction) is the mixed number 5/2.
- A rounded decimal (3.14, 1.414) is not an exact pi / surd answer; one that agrees to 1e-6 is
  credited, as a decimal of a fraction is.
- Several different final answers to a single-valued question are wrong (hedging), as is a
  final answer that is malformed or cut off, even when the right number appears in it.

Used by tests/test_math_grader_table.py and tools/bench_grader.py.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Row:
  family: str
  completion: str
  reference: str
  verdict: bool
  why: str


_SELF_CORRECTION = (
  "First I got $\\boxed{3}$.\n\nWait, that is wrong. Rechecking gives $\\boxed{4}$."
)

# One row per line (ruff format leaves this block alone).
# fmt: off
_RAW = [
  # --- notations of the same number: fractions and decimals -------------------------------------
  ("fraction", r"Half of them remain, so the answer is $\boxed{0.5}$.", r"\frac{1}{2}", True, "0.5 = 1/2"),
  ("fraction", r"The probability is $\boxed{\frac{1}{2}}$.", "0.5", True, "1/2 = 0.5"),
  ("fraction", r"So $p = \boxed{\dfrac12}$.", r"\frac{1}{2}", True, r"\dfrac12 is \frac{1}{2}"),
  ("fraction", r"Therefore $\boxed{\tfrac{1}{2}}$.", "1/2", True, r"\tfrac is \frac"),
  ("fraction", r"The answer is $\boxed{\frac 12}$.", "0.5", True, r"\frac 12 (space, no braces) is 1/2"),
  ("fraction", r"Final: $\boxed{2/4}$", r"\frac{1}{2}", True, "2/4 reduces to 1/2"),
  ("fraction", r"We get $\boxed{.5}$", "1/2", True, "leading-dot decimal"),
  ("fraction", r"We get $\boxed{0.50}$", r"\frac12", True, "trailing zero"),
  ("fraction", r"The slope is $\boxed{-\frac{3}{4}}$.", "-0.75", True, "negative fraction"),
  ("fraction", r"The slope is $\boxed{\frac{-3}{4}}$.", r"-\frac{3}{4}", True, "sign inside numerator"),
  ("fraction", r"The slope is $\boxed{\frac{3}{-4}}$.", r"-\frac34", True, "sign in denominator"),
  ("fraction", r"Thus $\boxed{{1 \over 3}}$.", r"\frac{1}{3}", True, r"plain-TeX \over"),
  ("fraction", r"So $\boxed{\frac{10}{4}}$.", r"\frac{5}{2}", True, "unreduced fraction"),
  ("fraction", r"So $\boxed{2.5}$.", r"\frac{5}{2}", True, "decimal of 5/2"),
  ("fraction", r"So $\boxed{0.3333333}$.", r"\frac{1}{3}", True, "7 decimals of 1/3 are within 1e-6"),
  ("fraction", r"So $\boxed{0.33}$.", r"\frac{1}{3}", False, "0.33 is a rounding, not 1/3"),
  ("fraction", r"So $\boxed{\frac{1}{3}}$.", "3", False, "1/3 is not 3"),
  ("fraction", r"So $\boxed{\frac{2}{3}}$.", r"\frac{3}{2}", False, "reciprocal"),
  ("fraction", r"So $\boxed{0.6}$.", r"\frac{2}{3}", False, "0.6 is not 2/3"),
  ("fraction", r"So the ratio is $\boxed{3:4}$.", r"\frac{3}{4}", True, "a ratio a:b is a/b"),
  ("fraction", r"So $\boxed{0.\overline{3}}$.", r"\frac{1}{3}", True, "repeating decimal with an overline"),
  ("fraction", r"So $\boxed{0.1\overline{6}}$.", r"\frac{1}{6}", True, "repeating tail"),
  ("fraction", r"So $\boxed{0.\overline{3}}$.", "0.3", False, "0.333... is not 0.3"),
  ("fraction", "So the answer is ½.", "0.5", True, "unicode vulgar fraction"),
  ("fraction", r"So $\boxed{\dfrac{\,3\,}{\,4\,}}$.", "0.75", True, "spacing inside a fraction"),
  # --- notations of the same integer -------------------------------------------------------------
  ("integer", r"So there are $\boxed{3.0}$ apples.", "3", True, "3.0 = 3"),
  ("integer", r"So there are $\boxed{3.}$ apples.", "3", True, "trailing dot"),
  ("integer", r"We get $\boxed{+3}$.", "3", True, "explicit plus sign"),
  ("integer", r"We get $\boxed{003}$.", "3", True, "leading zeros"),
  ("integer", r"The total is $\boxed{1,000}$.", "1000", True, "thousands comma"),
  ("integer", r"The total is $\boxed{1{,}000}$.", "1000", True, "LaTeX {,} separator"),
  ("integer", r"The total is $\boxed{1\,000}$.", "1000", True, r"thin-space separator \,"),
  ("integer", r"The total is $\boxed{1 000}$.", "1000", True, "space separator"),
  ("integer", r"The total is $\boxed{1\!000}$.", "1000", True, r"\! separator"),
  ("integer", r"The total is $\boxed{1,234,567}$.", "1234567", True, "several separators"),
  ("integer", r"The total is $\boxed{1234567}$.", "1,234,567", True, "separator in the reference"),
  ("integer", r"The total is $\boxed{1,234.5}$.", "1234.5", True, "separator and decimals"),
  ("integer", r"The total is $\boxed{12\text{,}000}$.", "12000", True, r"\text{,} separator"),
  ("integer", r"The total is $\boxed{\mathbf{12}}$.", "12", True, "bold number"),
  ("integer", r"The total is $\boxed{{12}}$.", "12", True, "extra braces"),
  ("integer", r"The total is $\boxed{\text{12}}$.", "12", True, "number in text"),
  ("integer", r"The total is $\boxed{1,000}$.", "100", False, "1,000 is not 100"),
  ("integer", r"The total is $\boxed{999999}$.", "1000000", False, "integers compare exactly"),
  ("integer", r"The total is $\boxed{1001}$.", "1000", False, "off by one"),
  ("integer", r"The total is $\boxed{12}$.", "21", False, "digits swapped"),
  ("integer", r"The total is $\boxed{3.5}$.", "3", False, "3.5 is not 3"),
  ("integer", r"The total is $\boxed{\text{three}}$.", "3", False, "number words are not graded"),
  # --- scientific notation -----------------------------------------------------------------------
  ("scientific", r"The count is $\boxed{1e3}$.", "1000", True, "1e3 = 1000"),
  ("scientific", r"The count is $\boxed{1 \times 10^3}$.", "1000", True, r"\times 10^n"),
  ("scientific", r"The count is $\boxed{1 \times 10^{3}}$.", "1000", True, r"\times 10^{n}"),
  ("scientific", r"The count is $\boxed{10^3}$.", "1000", True, "power of ten"),
  ("scientific", r"The count is $\boxed{1.5e-3}$.", "0.0015", True, "e-notation with negative exponent"),
  ("scientific", r"The count is $\boxed{1.2E+4}$.", "12000", True, "capital E, explicit plus"),
  ("scientific", r"The count is $\boxed{3 \cdot 10^3}$.", "3000", True, r"\cdot 10^n"),
  ("scientific", r"The count is $\boxed{2.5\cdot 10^{-3}}$.", "0.0025", True, r"\cdot and negative exponent"),
  ("scientific", r"The count is $\boxed{1.5 \times 10^{6}}$.", "1,500,000", True, "against a separated reference"),
  ("scientific", r"The count is $\boxed{6.02 \times 10^{23}}$.", r"6.02\times10^{23}", True, "same notation both sides"),
  ("scientific", r"The count is $\boxed{1 \times 10^4}$.", "1000", False, "wrong exponent"),
  ("scientific", r"The count is $\boxed{2.5 \times 10^{3}}$.", "0.0025", False, "exponent sign flipped"),
  # --- percent -----------------------------------------------------------------------------------
  ("percent", r"The increase is $\boxed{50\%}$.", "50", True, "answer key without the sign"),
  ("percent", r"The increase is $\boxed{50}$.", r"50\%", True, "answer key with the sign"),
  ("percent", r"The increase is $\boxed{50\%}$.", r"50\%", True, "both with the sign"),
  ("percent", r"The increase is 50%. The answer is 50%.", "50", True, "plain % in an answer line"),
  ("percent", r"The rate is $\boxed{12.5\%}$.", "12.5", True, "decimal percent"),
  ("percent", r"The probability is $\boxed{50\%}$.", "0.5", True, "50% is the quantity 0.5"),
  ("percent", r"The probability is $\boxed{25\%}$.", r"\frac{1}{4}", True, "25% is 1/4"),
  ("percent", r"The share is $\boxed{10 \%}$.", r"\frac{1}{10}", True, "space before the sign"),
  ("percent", r"The share is $\boxed{10\text{ percent}}$.", "10", True, "percent as a word"),
  ("percent", r"The share is $\boxed{33\frac{1}{3}\%}$.", r"\frac{1}{3}", True, "mixed-number percent"),
  ("percent", r"The increase is $\boxed{40\%}$.", "50", False, "wrong percentage"),
  ("percent", r"The probability is $\boxed{0.5\%}$.", "50", False, "0.5% is neither 50% nor 50"),
  ("percent", r"The increase is $\boxed{0.5}$.", r"50\%", False, "a bare 0.5 for a percentage key is ambiguous; not credited"),
  # --- units and currency ------------------------------------------------------------------------
  ("units", r"The side is $\boxed{5 \text{ cm}}$.", "5", True, r"\text unit"),
  ("units", r"The side is $\boxed{5\text{cm}}$.", "5", True, "unit without space"),
  ("units", r"The side is $\boxed{5\,\mathrm{cm}}$.", "5", True, r"\mathrm unit"),
  ("units", "The side is 5 cm long. The answer is 5 cm.", "5", True, "plain unit in an answer line"),
  ("units", r"The area is $\boxed{12 \text{ cm}^2}$.", "12", True, "squared unit"),
  ("units", r"The area is $\boxed{12\text{ square units}}$.", "12", True, "square units"),
  ("units", r"It costs $\boxed{\$5}$.", "5", True, "dollar sign"),
  ("units", r"It costs $\boxed{\$5.00}$.", "5", True, "dollars and cents"),
  ("units", r"It costs $\boxed{5 \text{ dollars}}$.", "5", True, "dollars as a word"),
  ("units", "She earns $18 per hour, so she gets $90 in total.\n#### 90", "90", True, "GSM8K marker"),
  ("units", r"The answer is $\boxed{\$1,250}$.", r"\$1250", True, "currency with separator on both sides"),
  ("units", r"He walks $\boxed{3 \text{ miles}}$.", r"3\text{ miles}", True, "reference keeps the unit"),
  ("units", r"It takes $\boxed{45\text{ minutes}}$.", "45", True, "time unit"),
  ("units", r"The speed is $\boxed{5\text{ m/s}}$.", "5", True, "compound unit"),
  ("units", r"The volume is $\boxed{8\,\text{cm}^3}$.", "8", True, "cubic unit"),
  ("units", r"The side is $\boxed{5~\text{cm}}$.", "5", True, "tie before the unit"),
  ("units", r"The side is $\boxed{5\mathrm{~cm}}$.", "5", True, r"tie inside \mathrm"),
  ("units", r"It costs $\boxed{\$\,1,000.50}$.", "1000.5", True, "currency, separator and cents"),
  ("units", r"It weighs $\boxed{2.5\text{ kg}}$.", r"\frac52", True, "decimal with a unit against a fraction"),
  ("units", r"The side is $\boxed{6 \text{ cm}}$.", "5", False, "wrong number with a unit"),
  ("units", r"The side is $\boxed{50 \text{ mm}}$.", "5", False, "no unit conversion: 50 is not 5"),
  ("units", r"It costs $\boxed{\$4.99}$.", "5", False, "close is not equal"),
  ("units", r"The rope is $\boxed{5 m}$ long.", "5", True, "one-letter unit after a space"),
  ("units", r"The speed is $\boxed{12 m/s}$.", "12", True, "one-letter compound unit"),
  ("units", r"So $\boxed{3}$.", "3n", False, "a letter after a number is not always a unit"),
  ("units", r"So $\boxed{2}$.", r"2\text{ m}", True, "unit in the reference"),
  # --- degrees -----------------------------------------------------------------------------------
  ("degrees", r"The angle is $\boxed{90^\circ}$.", "90", True, r"^\circ"),
  ("degrees", r"The angle is $\boxed{90^{\circ}}$.", "90", True, r"^{\circ}"),
  ("degrees", r"The angle is $\boxed{90°}$.", "90", True, "unicode degree sign"),
  ("degrees", r"The angle is $\boxed{90 \text{ degrees}}$.", "90", True, "degrees as a word"),
  ("degrees", r"The angle is $\boxed{90}$.", r"90^\circ", True, "reference with the sign"),
  ("degrees", r"The angle is $\boxed{45^\circ}$.", "90", False, "wrong angle"),
  # --- symbolic forms equal in value -------------------------------------------------------------
  ("symbolic", r"So $\boxed{2\sqrt{2}}$.", r"\sqrt{8}", True, "sqrt 8 = 2 sqrt 2"),
  ("symbolic", r"So $\boxed{\sqrt{8}}$.", r"2\sqrt{2}", True, "reverse direction"),
  ("symbolic", r"So $\boxed{\sqrt8}$.", r"2\sqrt2", True, "no braces"),
  ("symbolic", r"So $\boxed{\frac{\sqrt{3}}{3}}$.", r"\frac{1}{\sqrt{3}}", True, "rationalised denominator"),
  ("symbolic", r"So $\boxed{\frac{\sqrt{2}}{2}}$.", r"\sqrt{2}/2", True, "slash form"),
  ("symbolic", r"So $\boxed{\pi/2}$.", r"\frac{\pi}{2}", True, r"pi/2 vs \frac{\pi}{2}"),
  ("symbolic", r"So $\boxed{\frac{\pi}{2}}$.", r"\frac{1}{2}\pi", True, "coefficient form"),
  ("symbolic", r"So $\boxed{2^{10}}$.", "1024", True, "power evaluates"),
  ("symbolic", r"So $\boxed{\log_2 8}$.", "3", True, "log evaluates"),
  ("symbolic", r"So $\boxed{\binom{5}{2}}$.", "10", True, "binomial evaluates"),
  ("symbolic", r"So $\boxed{5!}$.", "120", True, "factorial evaluates"),
  ("symbolic", r"So $\boxed{\sin\frac{\pi}{6}}$.", r"\frac12", True, "exact trig value"),
  ("symbolic", r"So $\boxed{(x+1)^2}$.", "x^2+2x+1", True, "expanded polynomial"),
  ("symbolic", r"So $\boxed{1+x}$.", "x+1", True, "commuted sum"),
  ("symbolic", r"So $\boxed{3\sqrt{3}}$.", r"\sqrt{27}", True, "sqrt 27"),
  ("symbolic", r"So $\boxed{\sqrt{2}+1}$.", r"1+\sqrt{2}", True, "commuted surd sum"),
  ("symbolic", r"So $\boxed{\frac{1+\sqrt{5}}{2}}$.", r"\frac{\sqrt5+1}{2}", True, "golden ratio"),
  ("symbolic", r"So $\boxed{2\pi}$.", r"2 \pi", True, "spacing"),
  ("symbolic", "So the answer is √2.", r"\sqrt{2}", True, "unicode square root"),
  ("symbolic", "So the answer is π/2.", r"\frac{\pi}{2}", True, "unicode pi"),
  ("symbolic", "So the answer is sqrt(8).", r"2\sqrt{2}", True, "plain-text sqrt()"),
  ("symbolic", "So the answer is 2*sqrt(2).", r"\sqrt{8}", True, "plain-text product"),
  ("symbolic", r"So $\boxed{\frac{x}{2}}$.", r"\frac{1}{2}x", True, "coefficient form of x/2"),
  ("symbolic", r"So $\boxed{\sqrt[3]{27}}$.", "3", True, "cube root evaluates"),
  ("symbolic", r"So $\boxed{e^{0}}$.", "1", True, "exponential evaluates"),
  ("symbolic", r"So $\boxed{\sqrt{2}}$.", "1.414", False, "rounded surd"),
  ("symbolic", r"So $\boxed{1.4142136}$.", r"\sqrt{2}", True, "agrees to 1e-6, like a decimal of a fraction (convention)"),
  ("symbolic", r"So $\boxed{3.14}$.", r"\pi", False, "rounded pi"),
  ("symbolic", r"So $\boxed{x^2+1}$.", "(x+1)^2", False, "different polynomial"),
  ("symbolic", r"So $\boxed{\sqrt{3}}$.", r"\sqrt{2}", False, "different surd"),
  ("symbolic", r"So $\boxed{2^{10}}$.", "1000", False, "1024 is not 1000"),
  ("symbolic", r"So $\boxed{\frac{\pi}{3}}$.", r"\frac{\pi}{2}", False, "different angle"),
  ("symbolic", r"So $\boxed{2\sqrt{3}}$.", r"3\sqrt{2}", False, "sqrt 12 vs sqrt 18"),
  # --- equations and named values ----------------------------------------------------------------
  ("equation", r"Solving, $\boxed{x=3}$.", "3", True, "x = 3 answers 3"),
  ("equation", r"Solving, $\boxed{x = 3}$.", "x=3", True, "both as equations"),
  ("equation", r"Solving, $\boxed{3}$.", "x=3", True, "reference as an equation"),
  ("equation", r"Hence $\boxed{a = \frac{1}{2}}$.", "0.5", True, "named fraction"),
  ("equation", r"The line is $\boxed{y = 2x + 1}$.", "y=2x+1", True, "same equation"),
  ("equation", r"The line is $\boxed{y=1+2x}$.", "y=2x+1", True, "same line, terms commuted"),
  ("equation", r"Solving, $\boxed{x=4}$.", "3", False, "wrong value"),
  ("equation", r"Solving, $\boxed{x=-3}$.", "3", False, "wrong sign"),
  # --- sets, intervals, tuples -------------------------------------------------------------------
  ("structure", r"The roots are $\boxed{\{1, 2\}}$.", r"\{2,1\}", True, "sets are unordered"),
  ("structure", r"The roots are $\boxed{2, 1}$.", "1, 2", True, "a list of solutions is unordered"),
  ("structure", r"The roots are $\boxed{x=1, x=2}$.", "1,2", True, "named solutions"),
  ("structure", r"The point is $\boxed{(1, 2)}$.", "(1,2)", True, "ordered pair, same order"),
  ("structure", r"The point is $\boxed{(2, 1)}$.", "(1,2)", False, "ordered pair, swapped"),
  ("structure", r"The point is $\boxed{x=2, y=3}$.", "(2,3)", True, "named coordinates for a pair"),
  ("structure", r"The point is $\boxed{x=3, y=2}$.", "(2,3)", False, "named coordinates swapped"),
  ("structure", r"There is $\boxed{\varnothing}$.", r"\emptyset", True, "two symbols for the empty set"),
  ("structure", r"The point is $\boxed{\left(1, 2\right)}$.", "(1,2)", True, r"\left( \right)"),
  ("structure", r"The point is $\boxed{(1, 2, 3)}$.", "(1,2)", False, "extra coordinate"),
  ("structure", r"The solution is $\boxed{x > 2}$.", r"(2,\infty)", True, "inequality as an interval"),
  ("structure", r"The solution is $\boxed{1 \le x \le 3}$.", "[1,3]", True, "double inequality as an interval"),
  ("structure", r"The solution is $\boxed{x \ge 2}$.", r"(2,\infty)", False, "closed vs open endpoint"),
  ("structure", r"The set is $\boxed{[0, 1)}$.", "[0,1)", True, "same interval"),
  ("structure", r"The set is $\boxed{x \in [1, 3]}$.", "[1,3]", True, r"x \in interval"),
  ("structure", r"The set is $\boxed{(-\infty, 2]}$.", r"(-\infty,2]", True, "half-infinite"),
  ("structure", r"The set is $\boxed{[1,3] \cup [5,6]}$.", r"[1,3]\cup[5,6]", True, "union"),
  ("structure", r"The set is $\boxed{(0,1)}$.", "[0,1]", False, "open vs closed"),
  ("structure", r"The set is $\boxed{(-\infty, 2)}$.", r"(-\infty,2]", False, "endpoint excluded"),
  ("structure", r"The set is $\boxed{[1,3]}$.", r"[1,3]\cup[5,6]", False, "missing a piece"),
  ("structure", r"The roots are $\boxed{\{1, 3\}}$.", r"\{1,2\}", False, "different set"),
  ("structure", r"The values are $\boxed{(3, 4)}$.", "3, 4", True, "listed values written as a tuple"),
  ("structure", r"The roots are $\boxed{\{-2, 3\}}$.", "3, -2", True, "a set for a list of solutions"),
  ("structure", r"The values are $\boxed{(3, 5)}$.", "3, 4", False, "one value wrong"),
  ("structure", r"The vector is $\boxed{\begin{pmatrix}1\\2\end{pmatrix}}$.", r"\begin{pmatrix}1\\2\end{pmatrix}", True, "same matrix"),
  ("structure", r"The vector is $\boxed{\begin{pmatrix}2\\1\end{pmatrix}}$.", r"\begin{pmatrix}1\\2\end{pmatrix}", False, "entries swapped"),
  # --- negative numbers --------------------------------------------------------------------------
  ("negative", r"So $\boxed{−3}$.", "-3", True, "unicode minus sign U+2212"),
  ("negative", "The answer is −3.", "-3", True, "unicode minus in an answer line"),
  ("negative", r"So $\boxed{- 3}$.", "-3", True, "space after the minus"),
  ("negative", r"So $\boxed{(-3)}$.", "-3", True, "parenthesised"),
  ("negative", r"So $\boxed{-\frac{1}{2}}$.", "−0.5", True, "unicode minus in the reference"),
  ("negative", r"So $\boxed{-0}$.", "0", True, "negative zero"),
  ("negative", r"So $\boxed{–3}$.", "-3", True, "en dash used as a minus"),
  ("negative", r"The temperature is $\boxed{-5^\circ}$.", "-5", True, "negative with degrees"),
  ("negative", r"So $\boxed{3}$.", "-3", False, "sign dropped"),
  ("negative", r"So $\boxed{-3}$.", "3", False, "sign added"),
  ("negative", r"So $\boxed{-\sqrt{2}}$.", r"\sqrt{2}", False, "sign on a surd"),
  # --- mixed numbers -----------------------------------------------------------------------------
  ("mixed", r"It takes $\boxed{2\frac{1}{2}}$ hours.", r"\frac{5}{2}", True, "mixed number 2 1/2"),
  ("mixed", r"It takes $\boxed{2\tfrac12}$ hours.", "2.5", True, "mixed number, short form"),
  ("mixed", r"It takes $\boxed{2\ \frac{1}{2}}$ hours.", r"\frac52", True, "mixed number with a space"),
  ("mixed", r"It takes $\boxed{1\frac{3}{4}}$ cups.", "1.75", True, "mixed number 1 3/4"),
  ("mixed", r"It takes $\boxed{-1\frac{1}{2}}$.", "-1.5", True, "negative mixed number"),
  ("mixed", r"It takes $\boxed{\frac{5}{2}}$ hours.", r"2\frac{1}{2}", True, "mixed number as the reference"),
  ("mixed", r"It takes $\boxed{2\frac{1}{2}}$ hours.", "1", False, "mixed number is 5/2, not 2*(1/2)"),
  ("mixed", r"It takes $\boxed{2\frac{1}{3}}$ hours.", r"\frac52", False, "different mixed number"),
  # --- how the final answer is marked ------------------------------------------------------------
  ("marker", r"$\boxed{\boxed{3}}$", "3", True, "nested boxes"),
  ("marker", r"So the answer is \boxed{3}.", r"\boxed{3}", True, "boxed reference"),
  ("marker", r"So the answer is $\boxed 3$.", "3", True, r"\boxed 3 takes one token"),
  ("marker", r"So the answer is $\fbox{3}$.", "3", True, r"\fbox"),
  ("marker", r"First $\boxed{3}$, and to confirm, $\boxed{3}$.", "3", True, "the same answer boxed twice"),
  ("marker", r"The final answer is $\boxed{\frac{1}{\sqrt{2}}}$. I hope it is correct.", r"\frac{\sqrt2}{2}", True, "Minerva closing sentence"),
  ("marker", "Adding them, we get 42.\nThe answer is 42.", "42", True, "the answer is"),
  ("marker", "Adding them, we get 42.\nFinal Answer: 42", "42", True, "Final Answer:"),
  ("marker", "Adding them, we get 42.\n**Answer:** 42", "42", True, "markdown bold Answer:"),
  ("marker", "Adding them, we get 42.\nThe final answer is $42$.", "42", True, "final answer is $...$"),
  ("marker", "<think>6*7</think>\n<answer>42</answer>", "42", True, "answer tag"),
  ("marker", "The final answer is:\n\n42", "42", True, "answer on the line after the marker"),
  ("marker", "**Final Answer**\n42", "42", True, "markdown heading, then the answer"),
  ("marker", "The final answer is:\n\\[\n\\frac{1}{2}\n\\]", "0.5", True, "display block after the marker"),
  ("marker", "<answer>The answer is \\boxed{42}</answer>", "42", True, "box inside the answer tag"),
  ("marker", "Sum of the two.\n#### 42", "42", True, "GSM8K ####"),
  ("marker", r"So $\boxed{\text{(B)}}$.", "B", True, "choice letter in text"),
  ("marker", r"So the answer is (B).", "B", True, "parenthesised choice letter"),
  ("marker", "The answer is option (C).", "C", True, "choice named as an option"),
  ("marker", "The answer is choice (C).", "B", False, "wrong choice named as a choice"),
  ("marker", "The answer is: 42", "42", True, "answer is with a colon"),
  ("marker", "Therefore, the final answer is: $\\boxed{42}$", "42", True, "Llama-style closing line"),
  ("marker", "**Final Answer**\n\\[\n\\boxed{42}\n\\]", "42", True, "Qwen-style display box"),
  ("marker", r"So the answer is \textbf{42}.", "42", True, "bold answer after the marker"),
  ("marker", r"So $\boxed{C}$.", "B", False, "wrong choice"),
  ("marker", r"So the answer is $\boxed{\text{Yes}}$.", "yes", True, "word answers ignore case"),
  ("marker", r"So the answer is $\boxed{\text{No}}$.", "yes", False, "wrong word"),
  ("marker", r"So $\boxed{b}$.", "B", True, "a choice letter in lower case"),
  ("marker", "The answer is 41.", "42", False, "marked but wrong"),
  ("marker", "The answer is 3, since 3 > 2.", "3", True, "a justification after the answer"),
  ("marker", "The answer is 4 because it is even.", "4", True, "because-clause after the answer"),
  ("marker", "The answer is 12 (twelve).", "12", True, "parenthetical words after the answer"),
  ("marker", "The answer is 5, since 5 > 4.", "4", False, "the justification's number is not the answer"),
  # --- no clearly marked final answer (credited only with fallback="last_number") ---------------
  ("unmarked", "Adding them, we get 42.", "42", False, "no marked answer; default credits only marked answers"),
  ("unmarked", "6 times 7 is 42", "42", False, "no marked answer"),
  ("unmarked", "I am not sure how to solve this.", "42", False, "no answer at all"),
  ("unmarked", "To answer this, note that 6*7 = 42.", "42", False, "'answer' as a verb is no marker"),
  ("unmarked", "", "42", False, "empty completion"),
  # --- malformed or truncated final answers ------------------------------------------------------
  ("malformed", r"So the answer is $\boxed{3", "3", False, "unclosed box (truncated)"),
  ("malformed", r"We get $\boxed{\frac{1}{2}$", "1/2", False, "unbalanced braces in the box"),
  ("malformed", "The answer is 1/", "1", False, "fraction cut off"),
  ("malformed", r"The answer is $\frac{3}{", "3", False, "fraction cut off in LaTeX"),
  ("malformed", r"So $\boxed{}$.", "0", False, "empty box"),
  ("malformed", r"So $\boxed{1/}$.", "1", False, "dangling slash in the box"),
  ("malformed", r"So $\boxed{3+}$.", "3", False, "dangling operator"),
  ("malformed", r"So $\boxed{\sqrt{}}$.", "0", False, "empty root"),
  ("malformed", r"So $\boxed{\frac{1}{}}$.", "1", False, "empty denominator"),
  ("malformed", r"So $\boxed{3..5}$.", "3.5", False, "two decimal points"),
  ("malformed", r"So $\boxed{(1,2}$.", "(1,2)", False, "unclosed tuple"),
  ("malformed", r"The answer is \boxed{3}\boxed{", "3", False, "a second box cut off after the first"),
  ("malformed", "We have 3 + 4 = 7, so the answer is", "7", False, "cut off before the answer"),
  ("malformed", "Step 1: 6*7=42. Step 2: the answer is 4", "42", False, "cut off mid-number: 4 is marked"),
  ("malformed", r"So $\boxed{4 2}$.", "42", False, "a space splits digits only as a separator before groups of three"),
  # --- several answers or a wrong final answer ---------------------------------------------------
  ("several", r"It is $\boxed{3}$ or $\boxed{4}$.", "4", False, "hedging between two boxed answers"),
  ("several", r"It is $\boxed{3 \text{ or } 4}$.", "3", False, "hedging inside the box"),
  ("several", r"It is $\boxed{3, 4}$.", "3", False, "two answers to a single-valued question"),
  ("several", "The answer is 3 or 4.", "3", False, "hedging in the answer line"),
  ("several", r"It is $\boxed{3}$ or maybe $\boxed{3.0}$.", "3", True, "two notations of one answer"),
  ("several", r"It is $\boxed{3 \text{ and } 4}$.", "3", False, "two answers joined with and"),
  ("several", r"So $\boxed{3}$, or possibly $\boxed{-3}$.", "-3", False, "hedging on the sign"),
  ("several", "The answer is 3. Actually, the answer is 4.", "4", True, "corrected answer line: the last counts"),
  ("several", r"So $\boxed{\pm 3}$.", "3", False, "plus-minus is two answers"),
  ("several", r"So $\boxed{\pm 3}$.", "3, -3", True, "plus-minus gives both solutions"),
  ("several", r"So $\boxed{x = 3 \text{ or } x = -3}$.", r"\pm 3", True, "both solutions with or"),
  ("several", r"So $\boxed{3}$.", "3, -3", False, "one of two solutions"),
  ("several", "The answers are 2 and 3.", "2, 3", True, "plural marker, both solutions"),
  ("several", "The answers are 2 and 4.", "2, 3", False, "plural marker, one solution wrong"),
  ("several", _SELF_CORRECTION, "4", True, "self-correction: the last answer counts"),
  ("several", _SELF_CORRECTION, "3", False, "self-correction: the earlier answer does not count"),
  ("several", r"We have $3 + 4 = 7$ and $7 \cdot 2 = 14$, so $\boxed{15}$.", "7", False, "right number only in the working"),
  ("several", r"We have $3 + 4 = 7$ and $7 \cdot 2 = 14$, so $\boxed{15}$.", "14", False, "final answer 15 is not 14"),
  # --- held out: rows written after the ladder was tuned to the rows above, scored before any
  # further change (docs/benchmarks.md reports them separately) -----------------------------------
  ("fraction", r"So $\boxed{\frac{6}{8}}$.", "0.75", True, "unreduced 3/4"),
  ("fraction", r"So $\boxed{-.25}$.", r"-\frac14", True, "negative leading-dot decimal"),
  ("fraction", r"So $\boxed{1/4}$.", "0.4", False, "1/4 is 0.25"),
  ("integer", r"So $\boxed{10\,000}$.", "10000", True, "thin-space separator, five digits"),
  ("integer", r"So $\boxed{2{,}500}$.", "2,500", True, "separators on both sides"),
  ("integer", r"So $\boxed{250}$.", "2,500", False, "a digit short"),
  ("scientific", r"So $\boxed{3.2 \times 10^{-2}}$.", "0.032", True, "negative exponent"),
  ("scientific", r"So $\boxed{4 \times 10^2}$.", "40", False, "400 is not 40"),
  ("percent", r"So $\boxed{75\%}$.", r"\frac{3}{4}", True, "75% is 3/4"),
  ("percent", r"So $\boxed{7.5\%}$.", "0.75", False, "7.5% is 0.075"),
  ("units", r"The perimeter is $\boxed{20\text{ inches}}$.", "20", True, "inches"),
  ("units", r"He paid $\boxed{\$12.50}$.", "12.5", True, "currency with cents"),
  ("units", r"The area is $\boxed{16\pi \text{ cm}^2}$.", r"16\pi", True, "unit after a symbolic value"),
  ("units", r"She runs $\boxed{8 \text{ km}}$.", "80", False, "8 is not 80"),
  ("degrees", r"The angle is $\boxed{120^{\circ}}$.", "120", True, "degrees"),
  ("degrees", r"The angle is $\boxed{60^\circ}$.", r"120^\circ", False, "supplement, not the angle"),
  ("symbolic", r"So $\boxed{\frac{2}{\sqrt{2}}}$.", r"\sqrt{2}", True, "unrationalised"),
  ("symbolic", r"So $\boxed{4\sqrt{2}}$.", r"\sqrt{32}", True, "sqrt 32"),
  ("symbolic", r"So $\boxed{\sqrt{12}}$.", r"3\sqrt{2}", False, "sqrt 12 is 2 sqrt 3"),
  ("symbolic", r"So $\boxed{a^2 - b^2}$.", "(a-b)(a+b)", True, "difference of squares"),
  ("symbolic", r"So $\boxed{\ln e^2}$.", "2", True, "log of a power"),
  ("equation", r"So $\boxed{n = 12}$.", "12", True, "named integer"),
  ("equation", r"So $\boxed{k=-2}$.", "-2", True, "named negative"),
  ("equation", r"The line is $\boxed{y = 3x - 2}$.", "y=3x+2", False, "different intercept"),
  ("structure", r"The point is $\boxed{(3, -1)}$.", "(3,-1)", True, "pair with a negative"),
  ("structure", r"The point is $\boxed{(-1, 3)}$.", "(3,-1)", False, "pair swapped"),
  ("structure", r"The set is $\boxed{[2, 5]}$.", "[2,5)", False, "closed vs half-open"),
  ("structure", r"The solutions are $\boxed{-2, 3}$.", "3, -2", True, "unordered solutions"),
  ("structure", r"The solutions are $\boxed{x = -2 \text{ and } x = 3}$.", "-2, 3", True, "solutions joined with and"),
  ("negative", r"So $\boxed{-\frac{5}{3}}$.", r"\frac{-5}{3}", True, "sign placement"),
  ("negative", "The answer is −12.", "12", False, "unicode minus, sign wrong"),
  ("mixed", r"It is $\boxed{3\frac{3}{4}}$ miles.", r"\frac{15}{4}", True, "mixed number"),
  ("mixed", r"It is $\boxed{3 \frac{3}{4}}$.", "3.75", True, "mixed number with a space"),
  ("marker", "Thus, the answer is $\\boxed{7}$ apples.", "7", True, "box in a sentence"),
  ("marker", "ANSWER: 7", "7", True, "upper-case marker"),
  ("marker", "The answer: 7", "7", True, "answer: without is"),
  ("marker", "so the final answer is 7", "7", True, "lower-case final answer is"),
  ("malformed", r"The answer is \boxed{12.5", "12.5", False, "unclosed box with a decimal"),
  ("malformed", "The answer is 12.5.", "12.5", True, "a sentence period is not part of the number"),
  ("malformed", r"So $\boxed{\sqrt{2}/}$.", r"\sqrt{2}", False, "dangling slash after a root"),
  ("several", r"It is $\boxed{5}$ or $\boxed{-5}$.", "5", False, "hedging on the sign"),
  ("several", "The answer is 5 or -5.", r"\pm 5", True, "both solutions"),
  ("several", r"So $\boxed{2}$ and $\boxed{3}$.", "2, 3", True, "each solution boxed"),
  ("several", r"We found 12 earlier, but the answer is $\boxed{13}$.", "12", False, "the earlier number is not the answer"),
  ("unmarked", "Thus we have 7 apples.", "7", False, "no marked answer"),
]
# fmt: on


def load(raw: list[tuple] | None = None) -> list[Row]:
  """The table (or ``raw`` rows) as Rows; raises ValueError naming the row of a bad entry."""
  rows = []
  for i, entry in enumerate(_RAW if raw is None else raw):
    if len(entry) != 5:
      raise ValueError(f"math_grader_table row {i}: expected 5 fields, got {len(entry)}: {entry!r}")
    row = Row(*entry)
    fields_ok = all(
      isinstance(f, str) for f in (row.family, row.completion, row.reference, row.why)
    )
    if not fields_ok or not isinstance(row.verdict, bool) or not row.family or not row.why:
      raise ValueError(f"math_grader_table row {i}: bad field types or empty family/why: {entry!r}")
    rows.append(row)
  return rows
