// After a refused form, the keyboard lands on what to fix: the first field marked invalid (a form answered again
// with its errors), else the field a refusal message names (its "field-<name>" tag), marked invalid and described
// by that message.
document.addEventListener("DOMContentLoaded", () => {
  let field = document.querySelector('[aria-invalid="true"]');
  if (!field) {
    const message = document.querySelector('.messages li[class*="field-"]');
    const name = message && [...message.classList].find((c) => c.startsWith("field-"));
    if (name) {
      field = document.querySelector(`main [name="${CSS.escape(name.slice(6))}"]`);
      if (field) {
        message.id = message.id || "refused-message";
        field.setAttribute("aria-invalid", "true");
        field.setAttribute("aria-describedby", message.id);
        const closed = field.closest("details");
        if (closed) closed.open = true;
      }
    }
  }
  if (field) field.focus();
});
