-- Image signatures: an image may carry its publisher's detached ed25519 signature over its
-- digest (imagesig: 64 bytes, standard base64, 88 characters), and a SKU may require signed
-- images. Such a SKU's allocations resolve only signed images, and the provisioning task
-- carries the signature, the requirement and the controller's trusted publisher keys: the
-- host checks the signature before fetching the image or writing a byte of it to a disk.
ALTER TABLE os_images ADD COLUMN signature text NOT NULL DEFAULT ''
    CONSTRAINT os_images_signature_form CHECK (signature = '' OR signature ~ '^[A-Za-z0-9+/]{86}==$');
ALTER TABLE sku_catalog ADD COLUMN requires_signed_images boolean NOT NULL DEFAULT false;

---- create above / drop below ----

ALTER TABLE sku_catalog DROP COLUMN requires_signed_images;
ALTER TABLE os_images DROP COLUMN signature;
