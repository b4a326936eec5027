"""The bench's prompt texts, and the copy-heavy prompts of the speculation lanes and tests.

BENCH_TEXT is varied prose with no repeated sentence, long enough for 512-token prompts, so the
bench's ordinary prompts (windows of it) give prompt-lookup drafting nothing it did not earn.
COPY_HEAVY asks the model to repeat or continue a text or code listing it was given, so its
output copies its context and prompt-lookup drafts are often right.
"""

BENCH_TEXT = (
    "The river that runs through the old town was once the only road to the sea. Merchants floated timber, grain "
    "and salt down to the harbour, and in winter, when the water froze, children skated where the barges had been. "
    "Today the banks are parks, the warehouses are flats and small shops, and a bridge of glass and steel carries "
    "bicycles where the ferry used to cross. A baker on the north bank still opens at four in the morning, as her "
    "grandfather did, and sells rye loaves to the people who clean the streets before anyone else is awake. On "
    "Saturdays a market fills the square with cheese from the hill farms, apples in twenty varieties, honey, wool, "
    "and a man who repairs clocks while you wait. The library moved into the old customs house in the seventies; "
    "its reading room has the tallest windows in the county and a ceiling painted with ships that never existed. "
    "Students come there to revise for exams, retired engineers to argue about the tides, and tourists to "
    "photograph the spiral staircase. Every spring the council debates whether to dredge the channel again, and "
    "every spring it decides that the money is better spent on schools. Fishermen complain that the mud has moved "
    "the best spots downstream, while birdwatchers count more herons each year along the reeds. In the evenings "
    "the cafes put chairs out on the quay, a busker plays the same three songs on an accordion, and the last train "
    "to the city leaves at eleven minutes past ten. Historians disagree about the name of the town: some say it "
    "comes from a Celtic word for a ford, others from a Norman family who built the first mill. The mill burned "
    "down twice, was rebuilt in stone, and now houses a museum of printing with a working press from 1820. A "
    "volunteer there will set your name in lead type and print it on a card for a small donation. Across the water "
    "the hospital, the football ground and a new school sit on land that flooded every few years until the "
    "embankment was raised after the storm of 1953. Older residents still mark the height of that flood with a "
    "brass plate on the church tower, well above the heads of the people who pass it on their way to work. "
)

COPY_HEAVY = [
    "Repeat the following text exactly.\n\nText: The river that runs through the old town was once the only road "
    "to the sea. Merchants floated timber, grain and salt down to the harbour, and in winter, when the water froze, "
    "children skated where the barges had been.\n\nRepeated text: The river that runs through the old town",
    "Here is a Python module:\n\n"
    "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return a + b\n\n\n"
    "def subtract(a, b):\n    \"\"\"Return the difference of a and b.\"\"\"\n    return a - b\n\n\n"
    "def multiply(a, b):\n    \"\"\"Return the product of a and b.\"\"\"\n    return a * b\n\n\n"
    "Here is the same module again, unchanged:\n\ndef add(a, b):\n",
    "Days: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Again: Monday, Tuesday, Wednesday,",
]

# The 5 prompts of every route-parity check (tests/route_cases.py, //python:certify).
PARITY_PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Water boils at",
    "List three primary colors:",
]
