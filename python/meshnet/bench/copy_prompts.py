"""Copy-heavy prompts: the model is asked to repeat or continue a text or code listing it was
given, so its output copies its context and prompt-lookup drafts are often right. The bench's
speculation lanes and the speculation tests use these; ordinary prompts are the others."""

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
