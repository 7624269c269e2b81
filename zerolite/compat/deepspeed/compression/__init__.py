"""`deepspeed.compression`: DeepSpeed 0.19 removed its compression library and keeps this
package only so `deepspeed.compression.helper` imports (DeepSpeed-Chat's LoRA code does); the
same here."""
