"""Training prompts written for this project, in the five styles the benchmarks use.

None of them comes from a benchmark's test split (GSM8K, MATH-500, HumanEval, MBPP, MT-Bench): word
problems and maths questions are templates filled with random names and numbers or questions of
GSM8K's *training* split (`prompt_sets/`), coding tasks come from our own task list and from function
signatures of the Python standard library installed on this machine, and chat prompts combine our
own instructions and topics. The drafter learns from the target's answers to these prompts, so what
matters is that the *style* of the answers matches what the benchmarks ask for.

`training_prompts(n, seed, mix)` interleaves the styles of a mix so that every prefix of the list is
balanced. Mix "v1" made the archived answer shards 0-15; "v2" (the default) swaps the templated word
problems for GSM8K training questions and adds a second, broader family of chat instructions.
"""

from __future__ import annotations

import ast
import gzip
import json
import random
import sysconfig
from pathlib import Path
from functools import lru_cache
from typing import Callable, Iterator

PROMPT_SETS = Path(__file__).parent / "prompt_sets"

BOXED_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."
TESTS_PREFIX = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"

NAMES = ["Ava", "Liam", "Noah", "Mia", "Omar", "Priya", "Chen", "Lucia", "Tom", "Zara", "Ivan", "Keiko",
         "Diego", "Fatima", "Hugo", "Amara", "Ravi", "Elena", "Kofi", "Sara", "Jonas", "Nadia", "Pablo", "Yuki"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cupcakes", "stamps", "shells", "cookies",
         "toy cars", "oranges", "postcards", "beads", "candles", "notebooks", "plants"]
PLACES = ["bakery", "bookstore", "farm", "school fair", "library", "garden center", "toy shop", "market"]


def _word_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 60), rng.randint(2, 25), rng.randint(2, 9)
    name, other = rng.sample(NAMES, 2)
    item, place = rng.choice(ITEMS), rng.choice(PLACES)
    price = rng.choice([2, 3, 4, 5, 6, 8, 12, 15])
    templates = [
        f"{name} has {a} {item}. {other} gives {name} {b} more, and then {name} gives away {c}. "
        f"How many {item} does {name} have now?",
        f"A {place} sells {item} for ${price} each. {name} buys {b} of them and pays with a ${price * b + a} bill. "
        f"How much change does {name} get?",
        f"{name} reads {b} pages every day. The book has {a * c + b} pages. After {c} days, how many pages are left?",
        f"There are {a} students in a class. Each student needs {c} {item}. {item.capitalize()} come in packs of {b}. "
        f"How many packs does the teacher need to buy?",
        f"{name} earns ${a} per hour and works {c} hours a day for {b} days. {name} spends ${a * c} on food. "
        f"How much money is left?",
        f"A train travels at {a + 20} miles per hour for {c} hours and then at {b + 10} miles per hour for "
        f"{c + 1} hours. How far does it travel in total?",
        f"{name} is {c} years older than {other}. In {b} years their ages will add up to {2 * a + c + 2 * b}. "
        f"How old is {other} now?",
        f"A recipe uses {c} cups of flour for {b} {item}. How many cups of flour are needed for {b * a} {item}?",
        f"{name} saves ${b} every week. {other} starts with ${a} and saves ${c} every week. "
        f"After how many weeks will {name} have saved more than {other}?",
        f"The {place} had {a * 10} {item}. It sold {rng.randint(10, 90)}% of them on Monday and half of the rest "
        f"on Tuesday. How many {item} are left?",
        f"{name} bought {c} boxes with {b} {item} in each box. {name} shared them equally among {c + 1} friends "
        f"and kept the remainder. How many did each friend get, and how many did {name} keep?",
        f"A rectangle has a length of {a} cm and a width of {b} cm. {name} cuts out a square of side {c} cm. "
        f"What is the area of the remaining shape?",
    ]
    return rng.choice(templates) + BOXED_SUFFIX


def _competition_math(rng: random.Random) -> str:
    a, b, c, d = rng.randint(2, 19), rng.randint(2, 40), rng.randint(3, 15), rng.randint(2, 9)
    templates = [
        f"Find all real numbers $x$ such that ${a}x^2 - {b}x + {c} = 0$.",
        f"What is the remainder when ${a}^{{{b}}}$ is divided by ${c}$?",
        f"Compute $\\binom{{{c + d}}}{{{d}}}$.",
        f"Simplify $\\sqrt{{{a * a * b}}}$.",
        f"The sum of two numbers is ${a + b}$ and their difference is ${abs(a - b)}$. What is their product?",
        f"How many positive divisors does ${a * b * c}$ have?",
        f"If $f(x) = {a}x + {b}$ and $g(x) = x^2 - {d}$, what is $f(g({c}))$?",
        f"What is the least common multiple of ${a * d}$ and ${b + d}$?",
        f"A circle has circumference ${2 * c}\\pi$. What is its area? Express your answer in terms of $\\pi$.",
        f"Solve for $y$: $\\frac{{{a}y - {b}}}{{{d}}} = {c}$.",
        f"The arithmetic sequence ${a}, {a + d}, {a + 2 * d}, \\ldots$ has how many terms less than ${a + d * c * 3}$?",
        f"What is the sum of the interior angles of a polygon with ${c}$ sides, in degrees?",
        f"Evaluate $\\log_{{{d}}} {d ** 3}$ + $\\log_{{2}} {2 ** (a % 7 + 1)}$.",
        f"A bag has ${a}$ red and ${b}$ blue marbles. Two are drawn without replacement. What is the probability "
        f"that both are red? Express your answer as a common fraction.",
        f"Find the distance between the points $({a}, {-d})$ and $({-c}, {b})$.",
        f"What is the smallest positive integer $n$ such that ${d}n \\equiv {a} \\pmod{{{c + 10}}}$?",
    ]
    return rng.choice(templates) + BOXED_SUFFIX


CODING_TASKS = [
    ("reverse_words", "s: str", "str", "Return the words of the sentence s in reverse order."),
    ("is_palindrome", "s: str", "bool", "Return True if s reads the same forwards and backwards, ignoring case and spaces."),
    ("count_vowels", "text: str", "int", "Count the vowels in text."),
    ("second_largest", "numbers: list", "int", "Return the second largest distinct number in the list."),
    ("flatten", "nested: list", "list", "Flatten a list of lists into a single list."),
    ("rotate_list", "items: list, k: int", "list", "Rotate the list to the right by k positions."),
    ("merge_sorted", "a: list, b: list", "list", "Merge two sorted lists into one sorted list."),
    ("run_length_encode", "s: str", "str", "Compress s with run-length encoding, e.g. 'aaab' -> 'a3b1'."),
    ("gcd", "a: int, b: int", "int", "Return the greatest common divisor of a and b."),
    ("is_prime", "n: int", "bool", "Return True if n is a prime number."),
    ("primes_below", "n: int", "list", "Return all prime numbers smaller than n."),
    ("fibonacci", "n: int", "int", "Return the n-th Fibonacci number."),
    ("factorial", "n: int", "int", "Return n factorial."),
    ("word_frequencies", "text: str", "dict", "Return a dictionary mapping each word to how often it occurs."),
    ("transpose", "matrix: list", "list", "Return the transpose of a matrix given as a list of rows."),
    ("binary_search", "items: list, target: int", "int", "Return the index of target in the sorted list, or -1."),
    ("remove_duplicates", "items: list", "list", "Remove duplicates from the list while keeping the order."),
    ("capitalize_words", "s: str", "str", "Capitalize the first letter of every word."),
    ("sum_of_digits", "n: int", "int", "Return the sum of the decimal digits of n."),
    ("longest_common_prefix", "words: list", "str", "Return the longest common prefix of the words."),
    ("is_anagram", "a: str, b: str", "bool", "Return True if a and b are anagrams of each other."),
    ("max_subarray_sum", "numbers: list", "int", "Return the largest sum of a contiguous sublist."),
    ("celsius_to_fahrenheit", "celsius: float", "float", "Convert a temperature from Celsius to Fahrenheit."),
    ("chunk", "items: list, size: int", "list", "Split the list into chunks of the given size."),
    ("count_islands", "grid: list", "int", "Count groups of connected 1s in a grid of 0s and 1s."),
    ("valid_parentheses", "s: str", "bool", "Return True if the brackets in s are balanced."),
    ("to_binary", "n: int", "str", "Return the binary representation of n without the '0b' prefix."),
    ("pairs_with_sum", "numbers: list, total: int", "list", "Return all pairs of numbers that add up to total."),
    ("median", "numbers: list", "float", "Return the median of the numbers."),
    ("caesar_cipher", "text: str, shift: int", "str", "Shift every letter of text by shift places."),
    ("dict_invert", "mapping: dict", "dict", "Swap the keys and values of a dictionary."),
    ("nth_triangular", "n: int", "int", "Return the n-th triangular number."),
    ("common_elements", "a: list, b: list", "list", "Return the elements present in both lists."),
    ("snake_to_camel", "name: str", "str", "Convert a snake_case name to camelCase."),
    ("matrix_multiply", "a: list, b: list", "list", "Multiply two matrices given as lists of rows."),
    ("kth_smallest", "numbers: list, k: int", "int", "Return the k-th smallest element."),
    ("is_leap_year", "year: int", "bool", "Return True if year is a leap year."),
    ("digits_product", "n: int", "int", "Return the product of the non-zero digits of n."),
    ("string_compress_spaces", "s: str", "str", "Replace runs of spaces with a single space."),
    ("count_substring", "s: str, sub: str", "int", "Count (possibly overlapping) occurrences of sub in s."),
]
MBPP_STYLE = [
    "Write a function to {}", "Write a python function to {}", "Write a Python function to {}",
    "Write a function that will {}", "Create a function to {}",
]
MBPP_TASKS = [
    "find the minimum of three numbers.", "check whether a given number is even or odd.",
    "count the number of uppercase letters in a string.", "find the area of a trapezium.",
    "sort a list of tuples by their second element.", "find the cube of each element of a list using a lambda.",
    "remove all whitespace from a string.", "find the last two digits of a given number.",
    "check if all elements of a list are unique.", "find the sum of the squares of the first n natural numbers.",
    "convert a list of characters into a string.", "find the maximum product of two integers in a list.",
    "check whether a string starts with a vowel.", "return the index of the first even number in a list.",
    "multiply all the numbers in a list.", "find the nth pentagonal number.", "remove the k-th element of a list.",
    "check if a number is a perfect square.", "count the number of pairs whose xor is odd.",
    "find the length of the longest word in a sentence.", "split a string at uppercase letters.",
    "find the volume of a cuboid.", "check whether a triangle is valid given its angles.",
    "calculate the perimeter of a regular polygon.", "extract the numbers from a string.",
    "find the difference between the largest and smallest values in a list.", "count the set bits of a number.",
    "check whether a list is sorted.", "find the frequency of each element in a list.",
    "convert degrees to radians.", "find words that are longer than n characters in a list of words.",
    "return the sum of all odd-length sublists.", "interleave two lists of the same length.",
    "find the first repeated character in a string.", "zip two tuples into a list of pairs.",
    "find the number of days in a given month.", "compute the dot product of two vectors.",
]


def _coding_task(rng: random.Random) -> str:
    name, args, returns, doc = rng.choice(CODING_TASKS)
    style = rng.random()
    if style < 0.5:
        example = f"    >>> {name}(...)\n" if rng.random() < 0.3 else ""
        return TESTS_PREFIX + f'def {name}({args}) -> {returns}:\n    """{doc}\n{example}    """\n' + "\n```"
    task = doc[0].lower() + doc[1:] if style < 0.75 else rng.choice(MBPP_TASKS)
    return rng.choice(MBPP_STYLE).format(task)


def stdlib_signatures(limit: int = 4000) -> list[str]:
    """Signatures with short docstrings of top-level functions in this machine's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[str] = []
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="ignore"))
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) > 400 or not node.args.args:
                continue
            signature = ast.unparse(node.args)
            indented = "\n    ".join(doc.strip().splitlines())
            found.append(f'def {node.name}({signature}):\n    """{indented}\n    """\n')
            if len(found) >= limit:
                return found
    return found


ESSAY_TOPICS = ["renewable energy", "remote work", "the history of the printing press", "urban gardening",
                "learning a second language", "space exploration", "social media and teenagers", "electric cars",
                "the importance of sleep", "public libraries", "artificial intelligence in medicine",
                "climate change and agriculture", "the invention of the telephone", "volunteering",
                "minimalism", "ocean pollution", "video games in education", "the Roman Empire"]
CONCEPTS = ["photosynthesis", "inflation", "the Pythagorean theorem", "supply and demand", "black holes",
            "natural selection", "the water cycle", "compound interest", "machine learning", "plate tectonics",
            "the immune system", "recursion in programming", "entropy", "democracy", "vaccines",
            "the French Revolution", "probability", "the greenhouse effect", "DNA replication", "gravity"]
ROLES = ["a pirate captain", "a medieval knight", "a travel guide in Paris", "a detective", "a chef",
         "a museum curator", "an astronaut on Mars", "a football coach", "a wise old librarian", "a time traveler"]


def _chat_prompt(rng: random.Random) -> str:
    topic, concept, role = rng.choice(ESSAY_TOPICS), rng.choice(CONCEPTS), rng.choice(ROLES)
    n = rng.randint(3, 7)
    templates = [
        f"Write a short persuasive essay about {topic}.",
        f"Explain {concept} to a high school student.",
        f"Explain {concept} in simple terms, with an example.",
        f"Pretend you are {role}. Describe a typical day in your life.",
        f"Imagine you are {role}. Give a short speech to inspire your team.",
        f"Give me {n} tips for getting started with {topic}.",
        f"Write a blog post about {topic} for a general audience.",
        f"Compose a polite email to a colleague asking for feedback on a report about {topic}.",
        f"What are the advantages and disadvantages of {topic}?",
        f"Write a short poem about {concept}.",
        f"Summarize the main ideas behind {concept} in {n} bullet points.",
        f"Compare {concept} and {rng.choice(CONCEPTS)}. How are they similar and how are they different?",
        f"Write a short story that starts with: 'The last train left the station without {rng.choice(NAMES)}.'",
        f"Describe {n} common misconceptions about {concept} and correct them.",
        f"Draft a plan for a two-week trip to learn about {topic}, day by day.",
        f"If a student asked you why {concept} matters in everyday life, what would you say?",
        f"Extract the key facts from this text and list them: '{rng.choice(NAMES)} moved to a new city in "
        f"{rng.randint(1990, 2023)}, opened a {rng.choice(PLACES)} and hired {n} people.'",
    ]
    return rng.choice(templates)


@lru_cache(maxsize=1)
def gsm8k_train_questions() -> tuple[str, ...]:
    """The 7473 questions of GSM8K's training split (openai/grade-school-math@3101c7d,
    grade_school_math/data/train.jsonl, MIT licence); the test split is never used."""
    packed = (PROMPT_SETS / "gsm8k-train.jsonl.gz").read_bytes()
    return tuple(json.loads(line)["question"] for line in gzip.decompress(packed).decode().splitlines())


def _gsm8k_train_problem(rng: random.Random) -> str:
    return rng.choice(gsm8k_train_questions()) + BOXED_SUFFIX


PRODUCTS = ["two popular smartphones", "two laptops for students", "electric and petrol cars", "two streaming services",
            "e-readers and paper books", "two project management tools", "public transport and cycling to work"]
AUDIENCES = ["a five-year-old", "a busy manager", "a first-year university student", "a retired engineer",
             "a group of tourists", "new employees", "a skeptical investor"]
FIELDS = ["economics", "physics", "history", "biology", "chemistry", "philosophy", "computer science",
          "psychology", "geography", "music theory", "literature", "statistics"]
PUZZLES = [
    "If all bloops are razzies and all razzies are lazzies, are all bloops definitely lazzies? Explain.",
    "A farmer has to cross a river with a wolf, a goat and a cabbage. The boat holds the farmer and one item. "
    "How can everything get across safely?",
    "You are in a race and overtake the person in second place. What position are you in now?",
    "Three boxes are labelled apples, oranges and mixed, and every label is wrong. You may take one fruit "
    "from one box. How do you relabel all boxes?",
    "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much is the ball?",
    "There are five houses in a row, each painted a different colour. Describe how you would reason about a "
    "logic puzzle like this one step by step.",
    "If it takes five machines five minutes to make five widgets, how long would it take 100 machines to make "
    "100 widgets?",
]


def _broad_chat_prompt(rng: random.Random) -> str:
    """Instructions in the spirit of MT-Bench's categories (writing, roleplay, reasoning, maths, coding,
    extraction, STEM, humanities), written for this project with our own topics."""
    topic, concept, field = rng.choice(ESSAY_TOPICS), rng.choice(CONCEPTS), rng.choice(FIELDS)
    products, audience, role = rng.choice(PRODUCTS), rng.choice(AUDIENCES), rng.choice(ROLES)
    name, n, year = rng.choice(NAMES), rng.randint(3, 8), rng.randint(1950, 2024)
    templates = [
        f"Compose an engaging travel blog post about a recent trip to {rng.choice(['Kyoto', 'Lisbon', 'Peru', 'Iceland', 'Morocco', 'New Zealand'])}, "
        f"highlighting local food and places to visit.",
        f"Draft a professional email to your manager proposing a new policy on {topic}. Keep it short.",
        f"Write an outline for a blog post comparing {products}, with key points and subheadings.",
        f"Write a persuasive product description for a new {rng.choice(ITEMS)} subscription box.",
        f"Describe a vivid, unique character for a fantasy novel in fewer than {n * 20} words.",
        f"Write a short dialogue between {role} and {rng.choice(ROLES)} about {topic}.",
        f"Act as {role}. Answer this question in character: what is the hardest part of your job?",
        f"Embrace the role of a career coach. Give {audience} advice on starting a career in {field}.",
        f"Explain {concept} to {audience}, using one analogy.",
        f"In the field of {field}, what are {n} key ideas every beginner should know? Explain each briefly.",
        f"What were the main causes and consequences of events that shaped {field} around {year}? "
        f"Answer as a short essay.",
        f"Discuss the ethical questions raised by {topic}. Give arguments on both sides.",
        PUZZLES[rng.randrange(len(PUZZLES))],
        f"{name} has {n} siblings, and each sibling has exactly one sister. How many sisters are in the family "
        f"if {name} is a boy? Explain your reasoning.",
        f"Extract the names, dates and places from this text and return them as JSON: '{name} met "
        f"{rng.choice(NAMES)} in the {rng.choice(PLACES)} on {rng.randint(1, 28)} May {year} to plan a trip.'",
        f"Summarize the following in two sentences: {topic} has changed how people live and work. "
        f"Supporters point to new opportunities, while critics worry about costs and fairness.",
        f"Classify these items into categories and explain your choices: {', '.join(rng.sample(ITEMS, 5))}.",
        f"Describe the process of {concept} step by step, and mention one common experiment or example.",
        f"Give me a {n}-day study plan to learn the basics of {field}.",
        f"Write a limerick about {rng.choice(ITEMS)}, then explain what makes it funny.",
        f"Rewrite this sentence to sound more formal: 'hey, we gotta talk about {topic} asap.'",
        f"What is the difference between {concept} and {rng.choice(CONCEPTS)}? Use a table if helpful.",
        f"Write a Python script that reads a CSV file of {rng.choice(ITEMS)} sales and prints the total per month. "
        f"Explain the code.",
        f"Suggest {n} creative names for a {rng.choice(PLACES)} and explain each one.",
    ]
    return rng.choice(templates)


def training_prompts(count: int, seed: int = 0, mix: str = "v2", exclude: frozenset[str] = frozenset()) -> list[str]:
    """`count` prompts cycling through the styles of `mix` ("v1" or "v2"; see the module docstring), none of
    them in `exclude` (e.g. prompts already answered in a run)."""
    rng = random.Random(seed)
    signatures = stdlib_signatures()
    stdlib_task = lambda r: TESTS_PREFIX + r.choice(signatures) + "\n```"  # noqa: E731
    if mix == "v1":
        makers: list[Callable[[random.Random], str]] = [
            _word_problem, _competition_math, _coding_task, stdlib_task, _chat_prompt]
    elif mix == "v2":
        makers = [_gsm8k_train_problem, _competition_math, _coding_task, stdlib_task, _chat_prompt, _broad_chat_prompt]
    else:
        raise ValueError(f"unknown prompt mix {mix!r} (v1 or v2)")
    if not signatures:
        makers.remove(stdlib_task)
    seen: set[str] = set(exclude)
    prompts: list[str] = []
    stream: Iterator[int] = (i % len(makers) for i in range(10**9))
    attempts = 0
    while len(prompts) < count and attempts < count * 50:
        attempts += 1
        prompt = makers[next(stream)](rng)
        if prompt not in seen:
            seen.add(prompt)
            prompts.append(prompt)
    return prompts
